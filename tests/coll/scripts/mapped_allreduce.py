"""Run under mpiexec by tests/coll/test_shm.py: allreduce of arrays made by ``team.alloc`` (the
``mapped`` form) against numpy, and what the ranks get when they disagree."""

import gc
import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import ReduceOp, Team
from pycoll.ops import DTYPES
from tests.rank import run_rank
from tests.reference import ALL_DTYPES, assert_same, expected, make_input, valid_ops


def run(team, src, dst, op=ReduceOp.SUM, **kw):
    """The allreduce's result, and the algorithm the planner chose."""
    req = team.allreduce(src, dst, op, **kw)
    name = req.task.name
    return req.wait(), name


def check_values(team):
    n, r = team.size, team.rank
    for dtype in ALL_DTYPES:
        for i, op in enumerate(valid_ops(dtype)):
            for count in (0, n + 1, (32 << 10) // DTYPES[dtype].itemsize * n + 3):
                ins = [make_input(dtype, op, rr, count, seed=i) for rr in range(n)]
                want = expected(ins, op)
                what = f"n={n} {dtype} {op.name} count={count}"
                a = team.alloc(count, DTYPES[dtype])
                a[:] = ins[r]
                if (i + count) % 2:  # in place
                    got, name = run(team, a, a, op)
                else:  # both from alloc
                    b = team.alloc(count, DTYPES[dtype])
                    got, name = run(team, a, b, op)
                    assert_same([a], ins[r], f"{what}: the input changed")
                assert n == 1 or count == 0 or "mapped" in name, (what, name)
                assert_same([got], want, what)


def check_forms(team):
    n, r = team.size, team.rank
    # 2-D arrays, views at different offsets on different ranks, repeated calls (the express lane)
    a = team.alloc((64, 1000), np.float64)
    a[:] = r + 1
    got, name = run(team, a, a)
    assert (got == n * (n + 1) / 2).all() and (n == 1 or "mapped" in name), name
    start = 7 * r  # each rank's view starts elsewhere in its part
    v = a.reshape(-1)[start:start + 20_000]
    for k in range(5):
        v[:] = r + k
        got, name = run(team, v, v)
        assert (got == sum(rr + k for rr in range(n))).all(), k
    # an array of another region, the same shape: a kept plan moves to it
    c = team.alloc((64, 1000), np.float64)
    c[:] = 2.0
    got, _ = run(team, c, c)
    assert (got == 2.0 * n).all()
    # from 16 MiB the results go out with streaming stores while the next block's inputs are
    # prefetched: every element right, in place and not, an odd count (a short last block)
    big = (16 << 20) // 4 + 7 * n + 5
    x = team.alloc(big, np.float32)
    x[:] = np.arange(big, dtype=np.float32) % 1000 + r
    y = team.alloc(big, np.float32)
    want = (np.arange(big, dtype=np.float64) % 1000) * n + n * (n - 1) / 2
    got, name = run(team, x, y)
    assert (got == want).all() and (n == 1 or "mapped" in name), name
    got, _ = run(team, x, x)
    assert (got == want).all()
    del x, y, got
    # persistent, refilled between starts
    p = team.allreduce_init(a)
    for k in range(3):
        a[:] = r * k
        p.start().wait()
        assert (a == k * n * (n - 1) / 2).all(), k
    # AVG, MAX on bfloat16; a non-contiguous view goes the usual way
    x = team.alloc(5000, DTYPES["bfloat16"])
    x[:] = 2 * r
    got, _ = run(team, x, x, ReduceOp.AVG)
    assert (got.astype(np.float64) == n - 1).all()
    s = a[:, ::2]
    s[:] = 1
    out = np.empty(s.shape)
    got, name = run(team, np.ascontiguousarray(s), out)
    assert "mapped" not in name and (got == n).all(), name
    # plain arrays stay on the segment form; a tagged call never takes a segment form
    plain = np.full(1000, 1.0)
    got, name = run(team, plain, plain)
    assert "mapped" not in name and (got == n).all(), name
    t = team.alloc(1000)
    t[:] = 1
    got, name = run(team, t, t, tag="t")
    assert "mapped" not in name and (got == n).all(), name
    # the memory goes when the last array does (arrays kept by pycoll's plans keep theirs)
    if team.shared is not None:
        before = len(team.shared.regions)
        unused = team.alloc(10)
        assert len(team.shared.regions) == before + 1
        del unused
        gc.collect()
        team.shared.regions_of(np.zeros(1), np.zeros(1))  # (forgets the regions whose mapping is gone)
        assert len(team.shared.regions) <= before, (before, len(team.shared.regions))


def check_disagreement(team):
    n, r = team.size, team.rank
    if n == 1:
        assert type(team.alloc(3)) is np.ndarray
        return
    try:
        team.alloc(100 + (r == n - 1))
    except pycoll.MismatchError as exc:
        assert "different sizes" in str(exc), exc
    else:
        raise AssertionError("alloc with different sizes did not raise")
    try:  # one rank's bad shape: every rank raises
        team.alloc(-1 if r == 0 else 5)
    except ValueError as exc:
        assert "ranks [0]" in str(exc), exc
    else:
        raise AssertionError("alloc with a bad shape on rank 0 did not raise")
    # one rank's buffer is not from alloc: every rank raises, none hangs
    a = team.alloc(100_000)
    buf = np.ones(100_000, np.float32) if r == n - 1 else a
    buf[:] = 1
    try:
        team.allreduce(buf, buf, timeout=30).wait()
    except pycoll.MismatchError:
        pass
    else:
        raise AssertionError("a mapped allreduce against a segment one did not raise")


def main(mode):
    comm = MPI.COMM_WORLD
    team = Team.from_mpi(comm)
    if mode == "values":
        check_values(team)
        check_forms(team)
    elif mode == "disagree":
        check_disagreement(team)
    comm.Barrier()


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
