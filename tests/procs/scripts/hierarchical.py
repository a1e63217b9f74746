"""Run under mpiexec by tests/procs/test_hierarchical.py: hierarchical collectives (rab, split_rail,
hier bcast/barrier) on ranks pretending to be several nodes (PYCOLL_RANKS_PER_NODE), vs numpy.

argv: bootstrap (mpi | store), then "quick" for fewer dtypes.
"""

import os
import random
import sys
import time

import numpy as np
from mpi4py import MPI

from pycoll import ReduceOp, Team
from pycoll.ops import DTYPES
from tests.rank import run_rank
from tests.reference import ALL_DTYPES, assert_same, expected, make_input, valid_ops


def make_team(mode):
    world = MPI.COMM_WORLD
    if mode == "mpi":
        return Team.from_mpi(world)
    from pycoll.store import TCPStore

    port = None
    server = None
    if world.rank == 0:
        server = TCPStore(port=0, is_master=True, timeout=60)
        port = server.port
    port = world.bcast(port)
    team = Team.from_store(TCPStore("127.0.0.1", port, timeout=60), world.rank, world.size)
    team._server = server
    return team


def check_topology(team):
    topo = team.topology
    if os.environ.get("PYCOLL_NODE_ID"):  # blocks of ranks named by the test
        ids = MPI.COMM_WORLD.allgather(os.environ["PYCOLL_NODE_ID"])
        counts = [ids.count(i) for i in dict.fromkeys(ids)]
    else:
        counts = [int(c) for c in os.environ["PYCOLL_RANKS_PER_NODE"].split(",")]
    if len(counts) == 1:
        want = tuple(r // counts[0] for r in range(team.size))
    else:
        want = tuple(i for i, c in enumerate(counts) for _ in range(c))[:team.size]
    assert topo.nodes == want, (topo.nodes, want)
    node, rail = team.node_team(), team.rail_team()
    assert node.size == topo.ppn[topo.nodes[team.rank]] and node.rank == topo.local_rank(team.rank)
    assert rail.rank == topo.nodes[team.rank] or rail.size < topo.n_nodes
    lead = team.leaders_team()
    assert (lead is not None) == (node.rank == 0)
    if lead is not None:
        assert lead.size == topo.n_nodes and lead.rank == topo.nodes[team.rank]
    assert node.node_team() is node  # one node: its own node team
    # the node level runs on the node's shared segment (every rank of a node is on this host)
    assert node.size == 1 or node.shared is not None, "node team without a shared segment"
    assert team.shared is None, "a team spanning nodes must not share one segment"
    expect = os.environ.get("EXPECT_TLS")  # transports of the team, its node team, its rail team
    if expect:
        got = ",".join(t.transport.name for t in (team, node, rail))
        assert got == expect, (got, expect)


def check_allreduce(team, alg, dtypes, sizes, frag):
    """Every dtype and op (in place for every other op), then a large float32 SUM and AVG."""
    n, r = team.size, team.rank
    cases = [(dtype, op, count, i % 2 == 1) for dtype in dtypes for i, op in enumerate(valid_ops(dtype))
             for count in sizes]
    cases += [("float32", ReduceOp.SUM, 70001, False), ("float64", ReduceOp.AVG, 70001, True)]
    for dtype, op, count, in_place in cases:
        seed = count + list(ReduceOp).index(op)
        ins = [make_input(dtype, op, rr, count, seed) for rr in range(n)]
        buf = ins[r].copy()
        out = np.zeros(count, DTYPES[dtype])
        got = team.allreduce(buf, None if in_place else out, op, algorithm=alg, fragment_bytes=frag).wait()
        assert_same([got], expected(ins, op),
                    f"{alg} n={n} {dtype} {op.name} count={count} in_place={in_place}")


def check_bcast(team, sizes):
    for root in range(team.size):
        for count in sizes:
            buf = np.full(count, root if team.rank == root else -1, np.int64)
            buf[::7] = np.arange(0, count, 7) * (root if team.rank == root else 0)
            team.bcast(buf, root, algorithm="hier", fragment_bytes=4096).wait()
            want = np.full(count, root, np.int64)
            want[::7] = np.arange(0, count, 7) * root
            assert np.array_equal(buf, want), f"hier bcast root {root} count {count}: {buf[:8]}"


def check_barrier(team):
    # a barrier nobody leaves before the last rank entered: the last rank sleeps, then writes
    for _ in range(3):
        team.barrier(algorithm="hier").wait()
    for _ in range(50):
        team.barrier().wait()


def check_tagged_orders(team):
    """Tagged hierarchical allreduces posted in a different random order on every rank."""
    names = [f"g{i}" for i in range(8)]
    order = names[:]
    random.Random(team.rank).shuffle(order)
    bufs = {name: np.full(1000 + 37 * i, team.rank + i, np.float64) for i, name in enumerate(names)}
    reqs = [team.allreduce(bufs[name], tag=name, algorithm=("rab", "split_rail")[names.index(name) % 2],
                           fragment_bytes=2048) for name in order]
    for req in reqs:
        req.wait()
    for i, name in enumerate(names):
        want = sum(r + i for r in range(team.size))
        assert (bufs[name] == want).all(), (name, bufs[name][:4], want)


def level_tasks(task):
    """Every task of a (hierarchical) schedule, its sub-schedules' too."""
    for t in getattr(task, "tasks", ()):
        yield t
        yield from level_tasks(t)


def check_native_levels(team):
    """Over UCX the untagged collectives of the level between nodes run as native programs: the
    rail allreduce of split_rail (its sub-team records the program once per shape; with uneven
    nodes the local ranks past the smallest node's size sit out the rails); a tagged collective's
    levels are tagged and run in Python. Both give numpy's answer."""
    from pycoll.tl.ucx.executor import UCXProgramTask

    on_rail = team.levels.node.rank < min(team.topology.ppn) and team.levels.rail.size > 1

    for tag in (None, "native-levels"):
        for _ in range(2):
            x = np.arange(6000, dtype=np.float32) + team.rank
            out = np.empty_like(x)
            req = team.allreduce(x, out, algorithm="split_rail", tag=tag, fragment_bytes=8192)
            req.wait()
            kinds = {type(t).__name__ for t in level_tasks(req.task)}  # (built once its check is done)
            want = np.arange(6000, dtype=np.float32) * team.size + sum(range(team.size))
            assert np.array_equal(out, want), tag
            assert (UCXProgramTask.__name__ in kinds) == (tag is None and on_rail), (tag, on_rail, kinds)


def main(mode, quick):
    team = make_team(mode)
    check_topology(team)
    if os.environ.get("EXPECT_NATIVE_LEVELS"):
        check_native_levels(team)
    dtypes = ("float32", "int64", "bfloat16") if quick else ALL_DTYPES
    sizes = (0, 4099) if quick else (1, 4099)
    for alg in ("rab", "split_rail"):
        check_allreduce(team, alg, dtypes, sizes, frag=8192)
    # default selection picks the hierarchical algorithms on a team that spans nodes
    buf = np.ones(1 << 17, np.float32)
    req = team.allreduce(buf)
    assert "split_rail" in req.task.name, req.task.name
    req.wait()
    assert (buf == team.size).all()
    req = team.allreduce(np.ones(4, np.float32))
    assert "rd" in req.task.name, req.task.name  # small: flat (measured faster on this machine)
    req.wait()
    check_bcast(team, (0, 1, 10000))
    check_barrier(team)
    check_tagged_orders(team)
    team.barrier().wait()
    store = getattr(team, "store", None)
    team.close()
    if store is not None:  # the store's host (rank 0) stays until every rank has closed: closing
        store.add("closed", 1)  # a UCX team ends with a barrier through the store
        while team.rank == 0 and store.add("closed", 0) < team.size:
            time.sleep(0.01)


if __name__ == "__main__":
    run_rank(main, sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "quick")
