"""PYCOLL_BW_LIMIT: the per-process token bucket that sends wait on (pycoll/tl/limit.py).

The bucket is tested with a fake clock and a fake transport; then in-process teams (one bucket for
all their ranks). Real processes over tcp, shm (single-copy point to point) and mpi, where the
measured throughput must be close to the limit (unlimited, the same transfers run at > 0.5 GB/s):
tests/procs/test_bw_limit.py.
"""

import time

import numpy as np
import pytest

import pycoll
from pycoll import config
from pycoll.errors import TransportError
from pycoll.tl import limit
from pycoll.tl.base import Channel, Transport, TransportRequest
from pycoll.tl.limit import BURST_BYTES, BandwidthLimiter, limit_sends

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeTransport(Transport):
    """Records when each message was handed over; its sends complete at once."""

    name = "fake"

    def __init__(self, clock: Clock, rank: int = 0) -> None:
        self.clock = clock
        self.rank = rank
        self.sent = []  # (time, peer, tag, nbytes)
        self.closed = False

    def isend(self, buf, peer, tag):
        if peer == 99:
            raise TransportError("fake: lost rank 99")
        self.sent.append((self.clock(), peer, tag, buf.nbytes))
        req = TransportRequest("send", peer, tag, buf.nbytes)
        req.done = True
        return req

    def irecv(self, buf, peer, tag):
        raise AssertionError("the limiter holds sends only: these tests never receive")

    def close(self):
        self.closed = True


@pytest.fixture
def fake(monkeypatch):
    """(limiter at 1 MiB/s on a fake clock, a transport under it, the clock)."""
    clock = Clock()
    limiter = BandwidthLimiter(MiB, clock=clock)
    monkeypatch.setattr(limit, "_LIMITER", limiter)
    monkeypatch.setenv("PYCOLL_BW_LIMIT", str(MiB))
    t = FakeTransport(clock)
    assert limit_sends(t) is limiter and t.limiter is limiter
    return limiter, t, clock


def run_clock(clock, t, until, step=1e-3):
    """Advance the clock in ``step``s, letting the transport's progress release sends."""
    moved = 0
    while clock.now < until:
        clock.now += step
        moved += t.progress()
    return moved


def test_rate_and_burst(fake):
    limiter, t, clock = fake
    assert limiter.burst == BURST_BYTES  # 1 ms of 1 MiB/s is less
    start = clock.now
    reqs = [t.isend(np.zeros(128 << 10, np.uint8), 1, i) for i in range(16)]  # 2 MiB
    assert not any(r.done for r in reqs[1:]) and len(t.sent) == 0  # 128 KiB > the 64 KiB burst
    run_clock(clock, t, start + 3)
    assert [s[2] for s in t.sent] == list(range(16))
    for i, (when, _, _, _) in enumerate(t.sent):
        due = start + ((i + 1) * (128 << 10) - BURST_BYTES) / MiB  # serialization at the rate
        assert due <= when < due + 2e-3, (i, when - start, due - start)
    assert all(r.test() for r in reqs)


def test_fifo_and_large_messages(fake):
    limiter, t, clock = fake
    start = clock.now
    big = t.isend(np.zeros(5 * MiB, np.uint8), 1, "big")  # 80x the burst: never stuck
    small = [t.isend(np.zeros(10, np.uint8), p, ("small", p)) for p in (2, 3)]
    empty = t.isend(np.zeros(0, np.uint8), 2, "empty")  # needs no tokens, but keeps its place
    assert not big.test() and not small[0].test() and not empty.test()
    run_clock(clock, t, start + 4.9)
    assert t.sent == []
    run_clock(clock, t, start + 5.0)
    assert [s[2] for s in t.sent] == ["big", ("small", 2), ("small", 3), "empty"]
    assert 4.9 < t.sent[0][0] - start <= 5.0
    assert big.test() and all(r.test() for r in small) and empty.test()
    # the link is idle again: a burst's worth goes at once, then messages wait again
    clock.now += 10
    assert t.isend(np.zeros(BURST_BYTES, np.uint8), 1, "burst").done
    assert not t.isend(np.zeros(1, np.uint8), 1, "after").test()
    # zero bytes on an idle link: at once
    clock.now += 1
    assert t.isend(np.zeros(0, np.uint8), 1, "zero").done


def test_late_looks_cost_no_bandwidth(fake):
    """The engine backs off up to 1 ms (and a busy rank may not look for longer): while sends wait,
    tokens accrue for them, so the average rate stays the limit."""
    limiter, t, clock = fake
    start = clock.now
    for i in range(40):
        t.isend(np.zeros(100 << 10, np.uint8), 1, i)  # 4000 KiB
    run_clock(clock, t, start + 10, step=7e-3)
    assert len(t.sent) == 40
    last = t.sent[-1][0] - start
    assert abs(last - (40 * (100 << 10) - BURST_BYTES) / MiB) < 8e-3, last
    # but an idle link does not save more than a burst
    clock.now += 60
    n = sum(t.isend(np.zeros(16 << 10, np.uint8), 1, i).done for i in range(20))
    assert n == BURST_BYTES // (16 << 10)


def test_test_releases_cancel_drops_errors_reported(fake):
    limiter, t, clock = fake
    t.isend(np.zeros(BURST_BYTES, np.uint8), 1, "fill")  # takes the burst
    a = t.isend(np.zeros(1000, np.uint8), 1, "a")
    b = t.isend(np.zeros(1000, np.uint8), 99, "b")  # its transport will refuse it
    c = t.isend(np.zeros(1000, np.uint8), 1, "c")
    d = t.isend(np.zeros(1000, np.uint8), 1, "d")
    assert isinstance(a, TransportRequest) and not a.test() and not c.test()
    c.cancel()  # not released yet: dropped
    clock.now += 0.01
    assert d.test()  # testing releases what the bucket allows (in order), no progress() needed
    assert a.test() and [s[2] for s in t.sent] == ["fill", "a", "d"]
    with pytest.raises(TransportError, match="lost rank 99"):
        b.test()
    assert not c.done and limiter.queue == type(limiter.queue)()
    # closing the transport fails what it still has waiting
    e = t.isend(np.zeros(MiB, np.uint8), 1, "e")
    t.close()
    assert t.closed
    with pytest.raises(TransportError, match="closed before"):
        e.test()
    clock.now += 5
    assert t.progress() == 0 and [s[2] for s in t.sent] == ["fill", "a", "d"]


def test_sends_to_self_and_errors_on_an_empty_queue_are_immediate(fake):
    limiter, t, clock = fake
    t.isend(np.zeros(BURST_BYTES, np.uint8), 1, "fill")
    assert t.isend(np.zeros(MiB, np.uint8), 0, "self").done  # rank 0 to itself: no network
    clock.now += 1
    with pytest.raises(TransportError, match="lost rank 99"):
        t.isend(np.zeros(10, np.uint8), 99, "x")


def test_one_bucket_for_every_transport(fake):
    limiter, t, clock = fake
    other = FakeTransport(clock, rank=1)
    limit_sends(other)
    start = clock.now
    for i in range(4):
        (t if i % 2 else other).isend(np.zeros(256 << 10, np.uint8), 2, i)
    run_clock(clock, t, start + 2)  # one transport's progress releases the other's sends too
    sent = sorted(t.sent + other.sent)
    assert [s[2] for s in sent] == [0, 1, 2, 3]
    assert abs(sent[-1][0] - start - (MiB - BURST_BYTES) / MiB) < 2e-3


def test_channels_go_through_the_limit(fake):
    limiter, t, clock = fake
    ch = t.channel(("c", 7))
    assert type(ch) is Channel
    t.isend(np.zeros(BURST_BYTES, np.uint8), 1, "fill")
    req = ch.isend(np.zeros(1000, np.uint8), 1, 3)
    assert not req.done and limiter.queue[-1] is req and req.tag == ("c", 7, 3)


@pytest.mark.parametrize("value", [None, "", "0", "inf", "off"])
def test_off(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("PYCOLL_BW_LIMIT", raising=False)
    else:
        monkeypatch.setenv("PYCOLL_BW_LIMIT", value)
    assert config.get("PYCOLL_BW_LIMIT") == 0
    t = FakeTransport(Clock())
    assert limit_sends(t) is None and t.limiter is None
    assert "isend" not in vars(t) and "progress" not in vars(t) and "channel" not in vars(t)
    teams = pycoll.local_teams(2)
    assert "isend" not in vars(teams[0].transport) and teams[0].transport.fabric.limiter is None


def test_parse(monkeypatch):
    monkeypatch.setenv("PYCOLL_BW_LIMIT", "1.5G")
    assert config.get("PYCOLL_BW_LIMIT") == int(1.5 * (1 << 30))
    monkeypatch.setenv("PYCOLL_BW_LIMIT", "200MB")
    assert config.get("PYCOLL_BW_LIMIT") == 200 * MiB
    assert "PYCOLL_BW_LIMIT" in [row[0] for row in config.describe()]
    with pytest.raises(ValueError):
        BandwidthLimiter(0)


def test_local_teams_under_the_limit(monkeypatch):
    """In-process ranks share the process's bucket; receives drive it (local transports are not
    polled by the engine), so collectives finish, correct, in about their bytes over the limit."""
    monkeypatch.setattr(limit, "_LIMITER", None)
    monkeypatch.setenv("PYCOLL_BW_LIMIT", "40MB")
    teams = pycoll.local_teams(2)
    limiter = teams[0].transport.limiter
    assert limiter is not None and limiter is teams[1].transport.limiter and limiter.rate == 40 * MiB
    n = 1 << 20
    for tag, algorithm in ((("g", 1), "ring"), (None, "rd")):
        bufs = [np.full(n, r + 1, np.float32) for r in range(2)]
        t0 = time.monotonic()
        pycoll.wait_all([tm.allreduce(b, tag=tag, algorithm=algorithm) for tm, b in zip(teams, bufs)])
        elapsed = time.monotonic() - t0
        assert all((b == 3).all() for b in bufs)
        least = (2 * bufs[0].nbytes - BURST_BYTES) / limiter.rate  # both ranks' sends, one bucket
        assert least <= elapsed < 3 * least + 0.5, (algorithm, elapsed, least)
    assert not limiter.queue


def test_timeout_while_sends_wait_in_the_bucket(monkeypatch):
    """A collective whose sends wait on the bucket still times out, and its waiting sends leave the
    queue (canceled) rather than going out later."""
    monkeypatch.setattr(limit, "_LIMITER", None)
    monkeypatch.setenv("PYCOLL_BW_LIMIT", "1MB")
    teams = pycoll.local_teams(2)
    limiter = teams[0].transport.limiter
    bufs = [np.ones(2 << 20, np.float32) for _ in range(2)]  # 8 s of sends at 1 MiB/s
    t0 = time.monotonic()
    reqs = [tm.allreduce(b, tag="late", timeout=0.3) for tm, b in zip(teams, bufs)]
    with pytest.raises(pycoll.TimeoutError, match="send of"):
        pycoll.wait_all(reqs)
    assert time.monotonic() - t0 < 3
    assert limiter.queue and all(r.send is None for r in limiter.queue)
    assert limiter.release() == 0 and not limiter.queue
