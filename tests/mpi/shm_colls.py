"""Run under mpiexec by tests/test_shm.py: collectives on the shared segment vs numpy."""

import os
import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import ReduceOp, Team
from pycoll.ops import DTYPES
from pycoll.tl.shm.segment import DEFAULT_SLOT_BYTES
from tests.colltest import ALL_DTYPES, assert_same, expected, make_input, valid_ops
from tests.mpi.common import run_rank


def check_allreduce(team, dtype, op, count, in_place, seed=0):
    n, r = team.size, team.rank
    ins = [make_input(dtype, op, rr, count, seed) for rr in range(n)]
    buf = ins[r].copy()
    out = np.zeros(count, DTYPES[dtype])
    got = team.allreduce(buf, None if in_place else out, op).wait()
    assert_same([got], expected(ins, op), f"shm n={n} {dtype} {op.name} count={count} in_place={in_place}")


def main(mode):
    comm = MPI.COMM_WORLD
    team = Team.from_mpi(comm)
    n, r = team.size, team.rank
    expect_shm = n > 1 and "shm" in os.environ.get("PYCOLL_TLS", "shm")
    assert (team.shared is not None) == expect_shm, (team.shared, expect_shm)
    if mode == "matrix":
        for dtype in ALL_DTYPES:
            per_slot = DEFAULT_SLOT_BYTES // DTYPES[dtype].itemsize
            for i, op in enumerate(valid_ops(dtype)):
                for count in (0, 1, n + 1, 1000, per_slot + 1):
                    check_allreduce(team, dtype, op, count, in_place=(i + count) % 2 == 0)
        for count in (64 << 20) // 4, 5 * (DEFAULT_SLOT_BYTES // 4) // 2 + 1:
            check_allreduce(team, "float32", ReduceOp.SUM, count, in_place=False)
            check_allreduce(team, "float32", ReduceOp.MAX, count, in_place=True)
    # concurrent collectives on one team, completed in any order
    bufs = [np.full(1000 * (k + 1), float(r + k)) for k in range(6)]
    reqs = [team.allreduce(b) for b in bufs]
    breq = team.bcast(np.full(10, r, np.int32), root=n - 1)
    bar = team.barrier()
    pycoll.wait_all(list(reversed(reqs)) + [breq, bar])
    for k, b in enumerate(bufs):
        assert (b == sum(rr + k for rr in range(n))).all(), k
    assert (breq.wait() == n - 1).all()
    # bcast from every root, sizes across chunk boundaries
    for root in sorted({0, n // 2, n - 1}):
        for count in (0, 1, 100, (3 << 20) // 4 + 7):
            buf = np.arange(count, dtype=np.float32) + 7 if r == root else np.zeros(count, np.float32)
            team.bcast(buf, root=root).wait()
            assert (buf == np.arange(count, dtype=np.float32) + 7).all(), (root, count)
    for _ in range(5):
        team.barrier().wait()
    # the other collectives over the team's point-to-point transport
    for count in (0, 3, 100_001):
        root = n - 1
        out = np.zeros(count)
        team.reduce(np.full(count, r + 1.0), out if r == root else None, root=root).wait()
        if r == root:
            assert (out == n * (n + 1) / 2).all()
        ag = np.zeros(n * count)
        team.allgather(np.full(count, float(r)), ag).wait()
        assert (ag == np.repeat(np.arange(n, dtype=float), count)).all()
        rs = np.zeros(count)
        team.reduce_scatter(np.repeat(np.arange(n, dtype=float), count), rs).wait()
        assert (rs == n * r).all()
        a2a = np.zeros(n * count, np.int32)
        team.alltoall(np.repeat(np.arange(n, dtype=np.int32) + 10 * r, count), a2a).wait()
        assert (a2a == np.repeat(np.arange(n, dtype=np.int32) * 10 + r, count)).all()
        g = np.zeros(n * count, np.int64)
        team.gather(np.full(count, r, np.int64), g if r == 0 else None, root=0).wait()
        if r == 0:
            assert (g == np.repeat(np.arange(n), count)).all()
        sc = np.zeros(count, np.int64)
        whole = np.repeat(np.arange(n, dtype=np.int64), count) if r == root else None
        team.scatter(whole, sc, root=root).wait()
        assert (sc == r).all()
    # persistent collectives, started three times with refilled buffers
    buf = np.zeros(300_000, np.float32)
    pa = team.allreduce_init(buf)
    bb = np.zeros(1000, np.int16)
    pb = team.bcast_init(bb, root=n - 1)
    pbar = team.barrier_init()
    for run in range(3):
        buf[:] = r + run
        if r == n - 1:
            bb[:] = run + 5
        pycoll.wait_all([pa.start(), pb.start(), pbar.start()])
        assert (buf == sum(rr + run for rr in range(n))).all()
        assert (bb == run + 5).all()


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
