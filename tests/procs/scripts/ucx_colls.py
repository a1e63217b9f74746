"""Run under mpiexec by tests/procs/test_ucx.py with PYCOLL_TLS=ucx: every collective of Team over the
UCX transport vs numpy, on a team from MPI and a team from a TCPStore sharing one UCX worker, plus
tagged collectives in different orders per rank under a small credit, send/recv (from any source)
and a too-large message.

Argument: ``mpi-first`` (mpi4py imported before pycoll loads UCX: MPICH's UCX copy is used) or
``ucx-first`` (pycoll's loader first: the wheel's UCX, which MPICH then shares).
"""

import sys

ORDER = sys.argv[1] if len(sys.argv) > 1 else "mpi-first"
if ORDER == "ucx-first":
    from pycoll.tl.ucx import loader

    loader.load()
    assert loader.source == "wheel", loader.source

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import pycoll  # noqa: E402
from pycoll import MismatchError, ReduceOp, Team, TransportError, config  # noqa: E402
from pycoll.store import TCPStore  # noqa: E402
from pycoll.tl.ucx import loader  # noqa: E402
from pycoll.tl.ucx.executor import UCXProgramTask  # noqa: E402
from pycoll.tl.ucx.transport import context_worker  # noqa: E402
from tests.rank import run_rank  # noqa: E402
from tests.reference import (  # noqa: E402
    MIXED_KINDS,
    assert_same,
    check_mixed,
    expected,
    make_input,
    mixed_plan,
    post_mixed,
)


def every_collective(team, counts=(1, 100, 3000)):
    n = team.size
    for tagged in (False, True):
        bufs = {}
        k = 0
        for count in counts:
            for kind in MIXED_KINDS:
                req = post_mixed(team, kind, k, count, bufs, tagged=tagged, priority=0)
                req.wait()
                check_mixed(team, kind, k, count, bufs[k])
                k += 1
    for dtype, op in (("float32", ReduceOp.SUM), ("float64", ReduceOp.AVG), ("int32", ReduceOp.PROD),
                      ("int64", ReduceOp.MIN), ("float32", ReduceOp.MAX), ("uint8", ReduceOp.BAND),
                      ("int16", ReduceOp.BOR), ("int32", ReduceOp.BXOR), ("bool", ReduceOp.LAND),
                      ("bool", ReduceOp.LOR), ("bool", ReduceOp.LXOR), ("bfloat16", ReduceOp.SUM)):
        for count in (7, 5000):
            ins = [make_input(dtype, op, r, count, seed=count) for r in range(n)]
            out = np.empty_like(ins[team.rank])
            team.allreduce(ins[team.rank], out, op).wait()
            assert_same([out], expected(ins, op), f"allreduce {dtype} {op.name} {count}")
            for alg in ("ring", "rd"):
                out = np.empty_like(ins[team.rank])
                team.allreduce(ins[team.rank], out, op, algorithm=alg, tag=("alg", alg, count)).wait()
                assert_same([out], expected(ins, op), f"allreduce {alg} {dtype} {op.name} {count}")


def ring_in_fragments(team):
    """A large allreduce on 3+ ranks takes the ring, run as a native program of several fragments
    (2.4 MB: 3 of float32, 5 of float64), the same arrays again and then AVG in place."""
    n, r = team.size, team.rank
    if n < 3:
        return
    count = 600_000
    x = np.arange(count, dtype=np.float32) % 97 + r
    out = np.empty_like(x)
    want = (np.arange(count, dtype=np.float64) % 97) * n + n * (n - 1) / 2
    for _ in range(2):
        req = team.allreduce(x, out)
        assert isinstance(req.task, UCXProgramTask) and req.task.program.algorithm == "ring", req.task
        req.wait()
        assert (out == want).all()
    y = np.arange(count, dtype=np.float64) % 89 * (r + 1)
    team.allreduce(y, op=ReduceOp.AVG).wait()
    assert np.allclose(y, np.arange(count) % 89 * (n + 1) / 2)


def same_and_new_buffers(team):
    """A native program's task run again on the same arrays points at them as before, and at new
    ones when the call brings new ones: the results are right either way (repeated calls rerun the
    task of the first)."""
    n = team.size
    x, y = np.empty(2, np.float32), np.empty(2, np.float32)
    for k in range(9):
        x[:] = team.rank + k  # (the same array, new values)
        if k % 3 == 2:
            y = np.empty(2, np.float32)  # a new output array: the executor must write there
        team.allreduce(x, y).wait()
        assert (y == sum(range(n)) + n * k).all(), (k, y)


def views_and_arrays(team):
    """An allgather whose send buffer is a view of its own block of the receive buffer, then one of
    the same sizes with a separate send buffer, in turns: a native program recorded for the view
    reads the block from the receive buffer, so the other must not reuse it (it returned zeros)."""
    n, r = team.size, team.rank
    for it in range(6):
        recv = np.zeros(4 * n, np.float32)
        if it % 2 == 0:
            send = recv[4 * r:4 * r + 4]
            send[:] = r + 1 + it
        else:
            send = np.full(4, r + 1.0 + it, np.float32)
        team.allgather(send, recv).wait()
        assert (recv == np.repeat(np.arange(1, n + 1, dtype=np.float32) + it, 4)).all(), (it, recv)


def express_lane(team):
    """A repeated native program runs in the engine's express lane (started and polled in one
    native call): right results, every run but those behind the agreement check's exchange taken
    there. Its messages carry their call's mark: a peer's other dtype of the same size at any
    call number (here one that is no power of two) raises MismatchError on every rank, where the
    lane alone would have run the float32 sum on int32 bytes; the team then takes no more calls
    (under PYCOLL_CHECK=all the exchange caught it first, and the team goes on)."""
    n, r = team.size, team.rank
    x, y = np.empty(2, np.float32), np.empty(2, np.float32)
    runs = []
    plain = UCXProgramTask.express_run
    UCXProgramTask.express_run = lambda task, number: runs.append(number) or plain(task, number)
    try:
        for k in range(200):
            x[:] = r + k
            team.allreduce(x, y).wait()
            assert (y == sum(range(n)) + n * k).all(), (k, y)
    finally:
        UCXProgramTask.express_run = plain
    entry = team.recent.get(("allreduce", id(x)))
    if n == 1:
        return
    assert type(entry.lane).__name__ == "ProgramLane", entry.lane
    # (the first runs build it; a new call is remembered within 16 calls, see RecentCalls)
    checks = entry.persistent.task.checks_itself  # (PYCOLL_CHECK=all: every program checks first)
    assert len(runs) >= 150 and (checks or not any(team.planner.check_due("allreduce", k) for k in runs))
    if config.get("PYCOLL_CHECK") == "off":
        return
    while not team.planner.posted() & (team.planner.posted() - 1):  # (no power of two)
        team.allreduce(x, y).wait()
    other = x.view(np.int32) if r == n - 1 else x  # the same bytes as another element type
    try:
        team.allreduce(other, y if r < n - 1 else y.view(np.int32)).wait()
    except MismatchError as exc:
        assert "int32" in str(exc) and "float32" in str(exc), exc
    else:
        raise AssertionError(f"rank {r}: no MismatchError at collective {team.planner.posted() - 1}")
    x[:] = 1
    if checks:
        team.allreduce(x, y).wait()  # the team goes on: the exchange caught it before any data moved
        assert (y == n).all(), y
        return
    try:
        team.allreduce(x, y).wait()
    except MismatchError as exc:
        assert "out of step" in str(exc), exc
    else:
        raise AssertionError(f"rank {r}: a team whose calls went out of step took another call")


def point_to_point(team):
    n, r = team.size, team.rank
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    for count in (0, 10, 100_000):
        out = np.full(count, -1.0)
        rq = team.irecv(out, left, tag=("ring", count))
        team.isend(np.full(count, float(r)), right, tag=("ring", count)).wait()
        rq.wait()
        assert (out == left).all()
    # rank 0 receives one message from every other rank, from any source
    if r == 0:
        seen = set()
        for _ in range(n - 1):
            out = np.zeros(4)
            req = team.irecv(out, None, tag="any")
            req.wait()
            src = req.task.source
            assert (out == src).all() and src not in seen, (out, src)
            seen.add(src)
        assert seen == set(range(1, n))
    else:
        team.isend(np.full(4, float(r)), 0, tag="any").wait()
    team.barrier().wait()


def too_large(team):
    """A message larger than its receive buffer: a TransportError, both on the checked path
    (point to point) and on UCP's own (an untagged key: UCS_ERR_MESSAGE_TRUNCATED)."""
    if team.size == 1:
        return
    r = team.rank
    if r == 1:
        team.isend(np.arange(100, dtype=np.uint8), 0, tag="big").wait()
        req = team.transport.isend(np.arange(5000, dtype=np.uint8), 0, ("c", 10**9, 0))
        while not req.test():
            team.ctx.progress()
    elif r == 0:
        small = np.zeros(10, np.uint8)
        try:
            team.irecv(small, 1, tag="big").wait()
        except TransportError as exc:
            assert "larger than the receive buffer" in str(exc), exc
        else:
            raise AssertionError("a too-large message was received")
        req = team.transport.irecv(np.zeros(100, np.uint8), 1, ("c", 10**9, 0))
        try:
            while not req.test():
                team.ctx.progress()
        except TransportError as exc:
            assert "larger than the receive buffer" in str(exc), exc
        else:
            raise AssertionError("a truncated message was received")
    team.barrier().wait()


def credit_orders(comm):
    """Tagged mixed collectives, each rank in its own order, under a credit of 4 KiB."""
    ctx = pycoll.Context(credit_bytes=4096, partition_bytes=0, timeout=120)
    team = Team.from_mpi(comm, ctx)
    work = mixed_plan(150, seed=3)
    order = np.random.default_rng(team.rank).permutation(len(work))
    bufs = {}
    reqs = [post_mixed(team, work[k][0], int(k), work[k][1], bufs, tagged=True) for k in order]
    pycoll.wait_all(reqs)
    for k, (kind, count) in enumerate(work):
        check_mixed(team, kind, k, count, bufs[k])
    if team.size > 1:
        assert ctx.stats["credit_waits"] > 0, ctx.stats
    team.close()


def main():
    comm = MPI.COMM_WORLD
    n, rank = comm.size, comm.rank
    if ORDER == "mpi-first":
        loader.load()
        assert loader.source in ("process", "wheel"), loader.source
    ctx = pycoll.get_context()
    team = Team.from_mpi(comm)
    port = comm.bcast(TCPStore(port=0, is_master=True, timeout=60).port if rank == 0 else None)
    store = TCPStore("127.0.0.1", port, timeout=60)
    steam = Team.from_store(store, rank, n, prefix="ucxtest")
    if n > 1:
        assert team.transport.name == "ucx" and steam.transport.name == "ucx", (team, steam)
        # one worker per context
        assert team.transport.worker is steam.transport.worker is context_worker(ctx)
        assert team.transport.team_id != steam.transport.team_id
    for t in (team, steam):
        every_collective(t, counts=(1, 3000) if t is steam else (1, 100, 3000))
        ring_in_fragments(t)
        same_and_new_buffers(t)
        views_and_arrays(t)
        point_to_point(t)
        # (a team of its own: one whose calls went out of step takes no more)
        lane = Team.from_mpi(comm) if t is team else Team.from_store(store, rank, n, prefix="ucxlane")
        express_lane(lane)
        lane.close()
    # both teams at once: the same tags on two teams sharing the worker never mix
    a, b = np.full(1000, float(rank)), np.full(1000, 10.0 * rank)
    ra, rb = steam.allreduce(a, tag="same"), team.allreduce(b, tag="same")
    ra.wait()
    rb.wait()
    assert (a == sum(range(n))).all() and (b == 10 * sum(range(n))).all()
    too_large(team)
    credit_orders(comm)
    steam.close()
    team.close()
    comm.Barrier()  # (rank 0 serves the store: it stays until every rank is done with it)
    if n > 1:
        assert context_worker(ctx) is None  # the last team released the worker
    print(f"rank {rank}: UCX {'.'.join(map(str, loader.version()))} from {loader.source}", flush=True)


if __name__ == "__main__":
    run_rank(main)
