"""Topology, node/rail/leaders sub-teams and the hierarchical algorithms (rab, split_rail, hier
bcast and barrier) on in-process teams pretending to be nodes. In real processes:
tests/procs/test_hierarchical.py."""

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp
from pycoll.algorithms import select
from pycoll.errors import ConfigError
from pycoll.topology import Topology, node_key, pretend_node
from tests.reference import assert_same, expected, make_input, valid_ops


def test_pretend_nodes():
    assert [pretend_node(r, (3,)) for r in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert [pretend_node(r, (1, 4, 3)) for r in range(8)] == [0, 1, 1, 1, 1, 2, 2, 2]
    assert [pretend_node(r, (2, 1)) for r in range(5)] == [0, 0, 1, 2, 3]  # the last count repeats
    topo = Topology.from_keys(["b", "b", "a", "b", "a"])
    assert topo.nodes == (0, 0, 1, 0, 1) and topo.ppn == [3, 2] and topo.leaders == [0, 2]
    assert topo.rail(1) == [1, 4] and topo.rail(2) == [3] and topo.local_rank(3) == 2
    assert topo.hierarchical
    assert not Topology((0, 1, 2)).hierarchical and not Topology((0, 0)).hierarchical


def test_node_settings(monkeypatch):
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "3,x")
    with pytest.raises(ConfigError, match="PYCOLL_RANKS_PER_NODE"):
        node_key(0)
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "0")
    with pytest.raises(ConfigError, match=">= 1"):
        node_key(0)
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "2")
    assert node_key(3).endswith("#1")
    monkeypatch.setenv("PYCOLL_NODE_ID", "rack7")
    assert node_key(3) == "id:rack7"  # a named node wins


@pytest.mark.parametrize("rpn", ["4", "3", "1,4,3", "2"])
def test_sub_teams_local(monkeypatch, rpn):
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", rpn)
    teams = pycoll.local_teams(8)
    topo = teams[0].topology
    for r, team in enumerate(teams):
        node, rail = team.node_team(), team.rail_team()
        assert node.size == topo.ppn[topo.nodes[r]] and node.rank == topo.local_rank(r)
        assert rail.size == len(topo.rail(topo.local_rank(r)))
        lead = team.leaders_team()
        assert (lead is not None) == (r in topo.leaders)
        assert team.node_team() is node  # made once
    monkeypatch.delenv("PYCOLL_RANKS_PER_NODE")
    flat = pycoll.local_teams(4)  # no setting: one node
    assert flat[1].node_team() is flat[1] and flat[1].leaders_team() is None
    assert flat[0].leaders_team().size == 1


def _run(teams, post):
    reqs = [post(t) for t in teams]
    return [q.wait(30) for q in reqs]


@pytest.mark.parametrize("rpn", ["4", "3,3,2", "1,4,3", "2"])
@pytest.mark.parametrize("alg", ["rab", "split_rail"])
def test_hierarchical_allreduce_local(monkeypatch, rpn, alg):
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", rpn)
    teams = pycoll.local_teams(8)
    for dtype in ("float32", "int32", "bfloat16", "bool", "complex64"):
        for i, op in enumerate(valid_ops(dtype)):
            for count in (0, 3, 5003):
                ins = [make_input(dtype, op, r, count, count) for r in range(8)]
                bufs = [x.copy() for x in ins]
                outs = [np.empty_like(x) for x in ins]
                in_place = i % 2 == 0
                got = _run(teams, lambda t, b=bufs, o=outs, ip=in_place, op=op: t.allreduce(
                    b[t.rank], None if ip else o[t.rank], op, algorithm=alg, fragment_bytes=1024))
                assert_same(got, expected(ins, op), f"{alg} {rpn} {dtype} {op.name} {count}")


@pytest.mark.parametrize("rpn", ["4", "3,3,2", "1,4,3"])
def test_hierarchical_bcast_barrier_local(monkeypatch, rpn):
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", rpn)
    teams = pycoll.local_teams(8)
    for root in range(8):
        bufs = [np.full(3001, -1 if r != root else root, np.int16) for r in range(8)]
        _run(teams, lambda t, b=bufs, root=root: t.bcast(b[t.rank], root, algorithm="hier",
                                                         fragment_bytes=1000))
        assert all((b == root).all() for b in bufs), root
    _run(teams, lambda t: t.barrier(algorithm="hier"))


def test_barrier_hier_waits_for_every_node(monkeypatch):
    """No rank leaves the barrier before the last rank (on another node) entered it."""
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "3")
    teams = pycoll.local_teams(7)
    reqs = [t.barrier(algorithm="hier") for t in teams[:6]]
    for _ in range(200):
        teams[0].ctx.progress()
    assert not any(q.test() for q in reqs)
    reqs.append(teams[6].barrier(algorithm="hier"))
    for q in reqs:
        q.wait(10)


def test_selection_spans_nodes(monkeypatch):
    assert select("allreduce", 8, 4, hier=True) == "rd"  # small: the flat rules (measured)
    assert select("allreduce", 8, 64 << 20, hier=True) == "split_rail"
    assert select("bcast", 8, 4 << 20, hier=True) == "hier" and select("bcast", 8, 4, hier=True) == "knomial"
    monkeypatch.setenv("PYCOLL_TUNE", "barrier:hier")
    assert select("barrier", 8, 0, hier=True) == "hier" and select("barrier", 8, 0) == "dissemination"
    monkeypatch.delenv("PYCOLL_TUNE")
    assert select("allreduce", 8, 64 << 20) == "ring"  # never on a team within one node
    monkeypatch.setenv("PYCOLL_TUNE", "allreduce:0-inf:rab")
    assert select("allreduce", 8, 64 << 20) == "ring"
    assert select("allreduce", 8, 64 << 20, hier=True) == "rab"
    monkeypatch.delenv("PYCOLL_TUNE")
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "4")
    teams = pycoll.local_teams(8)
    bufs = [np.ones(1 << 16, np.float32) for _ in range(8)]
    reqs = [t.allreduce(b) for t, b in zip(teams, bufs)]
    assert "split_rail" in reqs[0].task.name
    for q in reqs:
        q.wait(10)
    assert (bufs[5] == 8).all()


def test_tagged_levels_any_order_small_credit(monkeypatch):
    """Tagged hierarchical allreduces posted in different orders per rank, under a credit of
    one small fragment: every level is tagged, so nothing waits on the wrong peer."""
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "3")
    monkeypatch.setenv("PYCOLL_CREDIT_BYTES", "4K")
    ctx = pycoll.engine.Context()
    teams = pycoll.local_teams(8, ctx)
    rng = np.random.default_rng(3)
    names = [f"t{i}" for i in range(6)]
    bufs = {(r, n): np.full(2000 + i, r + i, np.float64) for r in range(8) for i, n in enumerate(names)}
    reqs = []
    for t in teams:
        for n in rng.permutation(names):
            alg = "split_rail" if n < "t3" else "rab"
            reqs.append(t.allreduce(bufs[(t.rank, n)], tag=str(n), algorithm=alg, fragment_bytes=4096))
    for q in reqs:
        q.wait(30)
    for (r, n), b in bufs.items():
        i = names.index(n)
        assert (b == sum(rr + i for rr in range(8))).all(), (r, n)


def test_avg_divides_once(monkeypatch):
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "3")
    teams = pycoll.local_teams(8)
    for alg in ("rab", "split_rail"):
        bufs = [np.full(10, 8.0 * (r + 1)) for r in range(8)]
        _run(teams, lambda t, b=bufs, a=alg: t.allreduce(b[t.rank], op=ReduceOp.AVG, algorithm=a))
        assert np.allclose(bufs[2], 36.0), (alg, bufs[2])


@pytest.mark.parametrize("alg,coll", [("rab", "allreduce"), ("split_rail", "allreduce"), ("hier", "bcast"),
                                      ("hier", "barrier")])
def test_a_hierarchical_schedule_is_built_once_and_rebound(monkeypatch, alg, coll):
    """Repeated calls of one shape on new buffers (several fragments, uneven nodes, in place and
    not, SUM and AVG, untagged and tagged in different orders per rank): the right values on
    every call, and each rank builds each shape's schedule once (later calls rebind a kept one)."""
    from pycoll.algorithms.hier import levels

    built = []
    init = levels.HierSchedule.__init__
    monkeypatch.setattr(levels.HierSchedule, "__init__", lambda self, args: (built.append(args.rank),
                                                                           init(self, args))[1])
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "3,3,2")
    teams = pycoll.local_teams(8)
    n, calls = 5003, 0
    for in_place, op in ((False, ReduceOp.SUM), (True, ReduceOp.SUM), (False, ReduceOp.AVG)):
        for i in range(4):
            ins = [np.arange(n, dtype=np.float64) * (r + 1) + 10 * i for r in range(8)]
            bufs = [x.copy() for x in ins]
            outs = [np.empty_like(x) for x in ins]
            if coll == "allreduce":
                got = _run(teams, lambda t, b=bufs, o=outs, ip=in_place, op=op: t.allreduce(
                    b[t.rank], None if ip else o[t.rank], op, algorithm=alg, fragment_bytes=4096))
                want = sum(ins) / (8 if op is ReduceOp.AVG else 1)
                for r, g in enumerate(got):
                    assert np.allclose(g, want), (alg, in_place, op, i, r)
            elif coll == "bcast":
                _run(teams, lambda t, b=bufs: t.bcast(b[t.rank], 4, algorithm=alg, fragment_bytes=4096))
                for r in range(8):
                    assert (bufs[r] == ins[4]).all(), (i, r)
            else:
                _run(teams, lambda t: t.barrier(algorithm=alg))
            calls += 1
    # (a barrier repeats its last call: the second one becomes a persistent collective, built once)
    schedules = 3 if coll == "allreduce" else 2 if coll == "barrier" else 1
    assert len(built) == 8 * schedules, (len(built), calls)
    # tagged: one more shape; four in flight at once, posted in different orders per rank, every
    # call on new buffers; the second round rebinds the four schedules of the first
    for rnd in range(2 if coll == "allreduce" else 0):
        built.clear()
        ins = {(r, k): np.full(3000, 100.0 * k + r + rnd) for r in range(8) for k in range(4)}
        reqs = []
        for t in teams:
            order = range(4) if t.rank % 2 else reversed(range(4))
            for k in order:
                reqs.append((t.rank, k, t.allreduce(ins[(t.rank, k)], tag=f"g{k}", algorithm=alg,
                                                   fragment_bytes=4096)))
        for r, k, q in reqs:
            assert (q.wait(30) == sum(100.0 * k + rr + rnd for rr in range(8))).all(), (rnd, r, k)
        assert len(built) == (8 * 4 if rnd == 0 else 0), (rnd, len(built))


@pytest.mark.parametrize("rpn", [None, "1", "3,3,2"])
@pytest.mark.parametrize("alg", ["rab", "split_rail"])
def test_ranks_that_rebind_and_ranks_that_build_agree(monkeypatch, rpn, alg):
    """Some ranks repeat their arrays (a persistent collective, built anew) while the others pass
    new ones (a kept schedule, rebound), on teams with sub-teams and on teams where a level is the
    team itself (one node, or a rank per node: those schedules are never rebound, as their keys
    would come in another order than a build's): the right values, no rank waiting on another."""
    if rpn is None:
        monkeypatch.delenv("PYCOLL_RANKS_PER_NODE", raising=False)
    else:
        monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", rpn)
    n = 8 if rpn == "3,3,2" else 4
    teams = pycoll.local_teams(n)
    mine = [np.empty(1000) for _ in range(n)]
    for i in range(5):
        bufs = [mine[r] if r % 2 == 0 else np.empty(1000) for r in range(n)]
        for r in range(n):
            bufs[r][:] = r + i
        reqs = [t.allreduce(bufs[t.rank], algorithm=alg) for t in teams]  # (no options: repeats)
        for r, q in enumerate(reqs):
            assert (q.wait(10) == sum(range(n)) + n * i).all(), (i, r)
    own = teams[0].node_team() is teams[0] or teams[0].rail_team() is teams[0]
    assert own == (rpn != "3,3,2")
