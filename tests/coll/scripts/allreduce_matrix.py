"""Run by tests/coll/test_mpi.py under mpiexec: allreduce over MPI vs numpy."""

import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import ReduceOp, Team
from pycoll.ops import DTYPES
from tests.rank import run_rank
from tests.reference import ALL_DTYPES, assert_same, expected, make_input, valid_ops


def check(team, comm, dtype, op, count, alg, in_place, seed=0):
    n, r = team.size, team.rank
    inputs = [make_input(dtype, op, rr, count, seed) for rr in range(n)]
    want = expected(inputs, op)
    buf = inputs[r].copy()
    out = np.zeros(count, DTYPES[dtype])
    got = team.allreduce(buf, None if in_place else out, op, algorithm=alg).wait()
    assert_same([got], want, f"{alg} n={n} {dtype} {op.name} count={count} in_place={in_place}")


def main(mode):
    comm = MPI.COMM_WORLD
    team = Team.from_mpi(comm)
    n = team.size
    if mode == "matrix":
        for alg in ("rd", "ring", "knomial"):
            for dtype in ALL_DTYPES:
                for op in valid_ops(dtype):
                    for count in (0, 1, n - 1, n + 1, 1000):
                        check(team, comm, dtype, op, max(count, 0), alg, in_place=count % 2 == 1)
            for dtype, op in (("float32", ReduceOp.SUM), ("bfloat16", ReduceOp.MAX), ("int64", ReduceOp.BOR)):
                for in_place in (False, True):
                    check(team, comm, dtype, op, (1 << 20) + 3, alg, in_place)
    elif mode == "quick":
        for alg in ("rd", "ring", "knomial"):
            for count in (0, 1, n + 1, 70_000):
                check(team, comm, "float32", ReduceOp.SUM, count, alg, in_place=False)
                check(team, comm, "int32", ReduceOp.MAX, count, alg, in_place=True)
    elif mode == "split":
        sub = team.split(team.rank % 2, key=-team.rank)
        assert sub.size == (n + 1 - team.rank % 2) // 2
        x = np.array([float(team.rank)])
        sub.allreduce(x).wait()
        assert x[0] == sum(r for r in range(n) if r % 2 == team.rank % 2), x
        assert team.split(None) is None
        # concurrent collectives on two teams and on one team
        a, b = np.full(10, 1.0), np.full(10, 2.0)
        r1 = team.allreduce(a)
        r2 = sub.allreduce(b)
        r3 = team.allreduce(np.ones(3), algorithm="knomial")
        pycoll.wait_all([r3, r2, r1])
        assert a[0] == n and b[0] == 2 * sub.size
    elif mode == "tagged":
        ctx = pycoll.Context(credit_bytes=8192, partition_bytes=0, timeout=60)
        team = Team.from_mpi(comm, ctx)
        rng = np.random.default_rng(team.rank)
        k = 40
        bufs = {t: np.full(500 * (t % 7 + 1), float(team.rank + t)) for t in range(k)}
        reqs = [team.allreduce(bufs[t], tag=f"g{t}", priority=int(rng.integers(0, 4)),
                               algorithm=["rd", "ring", "knomial"][t % 3]) for t in rng.permutation(k)]
        pycoll.wait_all(reqs)
        for t in range(k):
            assert (bufs[t] == sum(rr + t for rr in range(n))).all(), t
        # partitioned, tagged, large enough for MPI's rendezvous protocol
        ctx2 = pycoll.Context(credit_bytes=1 << 20, partition_bytes=1 << 20, timeout=60)
        team2 = Team.from_mpi(comm, ctx2)
        big = {t: np.full((3 << 20) // 4 + t, float(t + team.rank), np.float32) for t in range(3)}
        reqs = [team2.allreduce(big[t], tag=("big", t)) for t in rng.permutation(3)]
        pycoll.wait_all(reqs)
        for t in range(3):
            assert (big[t] == sum(rr + t for rr in range(n))).all(), t


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
