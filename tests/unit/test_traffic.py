"""Traffic accounting (``Transport.traffic``, ``Team.traffic()``): payload bytes and messages per peer.

In-process teams check BytePS's figure for a ring allreduce of M bytes (every rank sends and
receives 2(n-1)/n*M, to its right and from its left neighbour) exactly, the message counts, reset,
messages to oneself, sub-teams and the bandwidth limiter's deferred sends; real processes check the
same figures over mpi, tcp, shm and ucx in tests/procs/test_traffic.py.
"""

import numpy as np
import pytest

import pycoll
from pycoll.algorithms.allreduce_ring import FRAGMENT_BYTES
from pycoll.tl import limit
from pycoll.tl.base import Traffic
from pycoll.tl.limit import BandwidthLimiter
from pycoll.tl.local import LocalFabric

# (they count messages, bytes or spans, or look inside a request's task: see the fixture)
pytestmark = pytest.mark.usefixtures("no_agreement_check")


FIELDS = ("sent", "received", "msgs_sent", "msgs_received")
ZERO = dict.fromkeys(FIELDS, 0)


def ring_allreduce(teams, nbytes, tag):
    bufs = [np.full(nbytes // 4, r + 1, np.float32) for r in range(len(teams))]
    pycoll.wait_all([t.allreduce(b, tag=tag, algorithm="ring") for t, b in zip(teams, bufs)])
    n = len(teams)
    assert all((b == n * (n + 1) // 2).all() for b in bufs)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("nbytes", [12 * 4096, 3 << 20])  # one pipeline fragment; several
def test_ring_allreduce_moves_2_n_minus_1_over_n(n, nbytes):
    teams = pycoll.local_teams(n)
    ring_allreduce(teams, nbytes, ("grad", 0))
    want = 2 * (n - 1) * nbytes // n
    block = nbytes // 4 // n
    frags = -(-block // max(1, FRAGMENT_BYTES // (n * 4)))
    msgs = 2 * (n - 1) * frags
    for t in teams:
        r = t.rank
        got = t.traffic()
        assert set(got) == {*range(n), "total"}
        assert got["total"] == {"sent": want, "received": want, "msgs_sent": msgs, "msgs_received": msgs}
        right, left = (r + 1) % n, (r - 1) % n
        assert got[right]["sent"] == want and got[right]["msgs_sent"] == msgs
        assert got[left]["received"] == want and got[left]["msgs_received"] == msgs
        assert got[r] == ZERO  # nothing to itself
        others = [p for p in range(n) if p not in (left, right)]
        assert all(got[p] == ZERO for p in others)
        # the transport's own view: only peers with traffic, same figures
        assert t.transport.traffic.total() == got["total"]
        assert set(t.transport.traffic.snapshot()) == {left, right}


def test_reset_and_accumulate():
    teams = pycoll.local_teams(3)
    m = 3 * 4096
    ring_allreduce(teams, m, "a")
    ring_allreduce(teams, m, "a")
    assert all(t.traffic()["total"]["sent"] == 2 * (2 * 2 * m // 3) for t in teams)
    for t in teams:
        t.reset_traffic()
        assert t.traffic() == {**{p: ZERO for p in range(3)}, "total": ZERO}
        assert t.transport.traffic.snapshot() == {}
    ring_allreduce(teams, m, "b")
    assert all(t.traffic()["total"]["received"] == 2 * 2 * m // 3 for t in teams)


def test_untagged_and_point_to_point():
    teams = pycoll.local_teams(2)
    bufs = [np.full(1000, r + 1, np.float64) for r in range(2)]
    pycoll.wait_all([t.allreduce(b, algorithm="rd") for t, b in zip(teams, bufs)])  # one exchange
    assert [t.traffic()["total"] for t in teams] == [
        {"sent": 8000, "received": 8000, "msgs_sent": 1, "msgs_received": 1}] * 2
    for t in teams:
        t.reset_traffic()
    # a receive buffer larger than the message counts the bytes that arrived
    big = np.zeros(500, np.uint8)
    recv = teams[1].irecv(big, 0, tag="x")
    teams[0].isend(np.ones(123, np.uint8), 1, tag="x").wait()
    recv.wait()
    assert teams[0].traffic()[1] == {"sent": 123, "received": 0, "msgs_sent": 1, "msgs_received": 0}
    assert teams[1].traffic()[0] == {"sent": 0, "received": 123, "msgs_sent": 0, "msgs_received": 1}


def test_messages_to_oneself_count_under_own_rank():
    teams = pycoll.local_teams(2)
    t = teams[1]
    out = np.zeros(64, np.uint8)
    recv = t.irecv(out, 1, tag="me")
    t.isend(np.ones(64, np.uint8), 1, tag="me").wait()
    recv.wait()
    got = t.traffic()
    assert got[1] == {"sent": 64, "received": 64, "msgs_sent": 1, "msgs_received": 1}
    assert got["total"] == got[1]
    lean = t.traffic(include_self=False)
    assert set(lean) == {0, "total"} and lean["total"] == ZERO
    assert t.transport.traffic.total(include_self=False) == ZERO
    assert t.transport.traffic.snapshot(include_self=False) == {}


def test_traffic_class():
    tr = Traffic(rank=0)
    tr.sent(1, 100)
    tr.sent(1, 50)
    tr.received(2, 7)
    tr.sent(0, 5)
    assert tr.snapshot() == {1: {"sent": 150, "received": 0, "msgs_sent": 2, "msgs_received": 0},
                             2: {"sent": 0, "received": 7, "msgs_sent": 0, "msgs_received": 1},
                             0: {"sent": 5, "received": 0, "msgs_sent": 1, "msgs_received": 0}}
    assert tr.total() == {"sent": 155, "received": 7, "msgs_sent": 3, "msgs_received": 1}
    assert tr.total(include_self=False) == {"sent": 150, "received": 7, "msgs_sent": 2, "msgs_received": 1}
    snap = tr.snapshot()
    snap[1]["sent"] = 0  # a copy
    assert tr.snapshot()[1]["sent"] == 150
    assert "155 B" in repr(tr)
    tr.reset()
    assert tr.snapshot() == {} and tr.total() == ZERO
    # every transport has its own, made on first use
    fabric = LocalFabric(2)
    a, b = fabric.transport(0), fabric.transport(1)
    assert a.traffic is a.traffic and a.traffic is not b.traffic and b.traffic.rank == 1


def test_deferred_sends_count_when_released(monkeypatch):
    now = [100.0]
    limiter = BandwidthLimiter(1 << 20, clock=lambda: now[0])
    monkeypatch.setattr(limit, "_LIMITER", limiter)
    monkeypatch.setenv("PYCOLL_BW_LIMIT", str(1 << 20))
    fabric = LocalFabric(2)
    t0, t1 = fabric.transport(0), fabric.transport(1)
    assert t0.limiter is limiter
    size = 4 * limit.BURST_BYTES
    first = t0.isend(np.zeros(limit.BURST_BYTES, np.uint8), 1, "fill")  # takes the burst
    held = t0.isend(np.zeros(size, np.uint8), 1, "held")
    assert first.done and not held.test()
    assert t0.traffic.snapshot()[1]["msgs_sent"] == 1  # only what was handed over
    now[0] += 1.0
    t0.progress()
    assert held.test()
    assert t0.traffic.snapshot()[1] == {"sent": limit.BURST_BYTES + size, "received": 0, "msgs_sent": 2,
                                        "msgs_received": 0}
    out = np.zeros(size, np.uint8)
    t1.irecv(np.zeros(limit.BURST_BYTES, np.uint8), 0, "fill")
    assert t1.irecv(out, 0, "held").test()
    assert t1.traffic.total()["received"] == limit.BURST_BYTES + size


def test_sub_teams_are_counted_under_team_ranks(monkeypatch):
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "2")
    teams = pycoll.local_teams(4)  # nodes {0, 1}, {2, 3}; rails {0, 2}, {1, 3}
    assert teams[0].levels.node is not None and teams[0].levels.rail is not None
    m = 8 * 4096
    bufs = [np.full(m // 4, r + 1, np.float32) for r in range(4)]
    pycoll.wait_all([t.allreduce(b, algorithm="split_rail") for t, b in zip(teams, bufs)])
    assert all((b == 10).all() for b in bufs)
    for t in teams:
        r = t.rank
        node_peer, rail_peer = r ^ 1, r ^ 2
        got = t.traffic()
        assert got[node_peer]["sent"] > 0 and got[node_peer]["received"] > 0, got
        assert got[rail_peer]["sent"] > 0 and got[rail_peer]["received"] > 0, got
        assert got[r ^ 3] == ZERO and got[r] == ZERO
        node, rail = t.levels.node.traffic(), t.levels.rail.traffic()
        assert got[node_peer] == node[t.levels.node.rank ^ 1]
        assert got[rail_peer] == rail[t.levels.rail.rank ^ 1]
        assert t.traffic(subteams=False)["total"] == ZERO  # the team's own transport moved nothing
    assert sum(t.traffic()["total"]["sent"] for t in teams) == sum(t.traffic()["total"]["received"]
                                                                   for t in teams)
    for t in teams:
        t.reset_traffic()
        assert t.traffic()["total"] == ZERO
