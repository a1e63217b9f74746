"""Every collective on in-process teams against numpy: sizes 1..64, every dtype and op for the
reducing ones, roots first/middle/last, counts 0, 1, odd and large, in place where it applies."""

import numpy as np
import pytest

import pycoll
from pycoll.ops import DTYPES
from tests.reference import ALL_DTYPES, assert_same, expected, make_input, valid_ops

SIZES = [1, 2, 3, 4, 5, 7, 8, 16, 33, 64]
COUNTS = [0, 1, 7, 1000]


def roots(n):
    return sorted({0, n // 2, n - 1})


@pytest.mark.parametrize("n", SIZES)
def test_bcast(n):
    teams = pycoll.local_teams(n)
    for root in roots(n):
        for count in COUNTS:
            want = np.arange(count, dtype=np.int32) * 3 + 1
            bufs = [want.copy() if r == root else np.zeros(count, np.int32) for r in range(n)]
            pycoll.wait_all([t.bcast(bufs[r], root=root) for r, t in enumerate(teams)])
            assert all(np.array_equal(b, want) for b in bufs), (root, count)


@pytest.mark.parametrize("n", SIZES)
def test_reduce_every_root_and_in_place(n):
    teams = pycoll.local_teams(n)
    for root in roots(n):
        for count in COUNTS:
            ins = [make_input("float64", pycoll.ReduceOp.SUM, r, count) for r in range(n)]
            bufs = [x.copy() for x in ins]
            out = np.zeros(count)
            in_place = count % 2 == 1
            reqs = [t.reduce(bufs[r], None if (in_place and r == root) else (out if r == root else None),
                             root=root) for r, t in enumerate(teams)]
            pycoll.wait_all(reqs)
            got = bufs[root] if in_place else out
            assert_same([got], expected(ins, pycoll.ReduceOp.SUM), f"reduce root={root} count={count}")
            for r in range(n):
                if r != root or not in_place:
                    assert np.array_equal(bufs[r], ins[r])  # inputs untouched


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reduce_and_reduce_scatter_every_dtype_and_op(dtype):
    n = 4
    teams = pycoll.local_teams(n)
    for op in valid_ops(dtype):
        for count in (1, 13):
            ins = [make_input(dtype, op, r, count * n) for r in range(n)]
            want = expected(ins, op)
            outs = [np.zeros(count, DTYPES[dtype]) for _ in range(n)]
            pycoll.wait_all([t.reduce_scatter(ins[r], outs[r], op) for r, t in enumerate(teams)])
            for r in range(n):
                assert_same([outs[r]], want[r * count:(r + 1) * count], f"reduce_scatter {dtype} {op.name}")
            out = np.zeros(count * n, DTYPES[dtype])
            pycoll.wait_all([t.reduce(ins[r], out if r == 3 else None, op, root=3)
                             for r, t in enumerate(teams)])
            assert_same([out], want, f"reduce {dtype} {op.name}")


@pytest.mark.parametrize("n", SIZES)
def test_allgather_and_in_place(n):
    teams = pycoll.local_teams(n)
    for count in COUNTS:
        ins = [np.arange(count, dtype=np.int64) + 100 * r for r in range(n)]
        want = np.concatenate(ins) if count else np.zeros(0, np.int64)
        outs = [np.zeros(n * count, np.int64) for _ in range(n)]
        pycoll.wait_all([t.allgather(ins[r], outs[r]) for r, t in enumerate(teams)])
        assert all(np.array_equal(o, want) for o in outs), count
        outs = [want.copy() * (np.arange(n * count) // max(count, 1) == r) for r in range(n)]
        pycoll.wait_all([t.allgather(None, outs[r]) for r, t in enumerate(teams)])
        assert all(np.array_equal(o, want) for o in outs), count


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter(n):
    teams = pycoll.local_teams(n)
    for count in COUNTS:
        ins = [np.arange(n * count, dtype=np.float64) * (r + 1) for r in range(n)]
        want = expected(ins, pycoll.ReduceOp.SUM)
        outs = [np.zeros(count) for _ in range(n)]
        pycoll.wait_all([t.reduce_scatter(ins[r], outs[r]) for r, t in enumerate(teams)])
        for r in range(n):
            assert np.array_equal(outs[r], want[r * count:(r + 1) * count]), (r, count)


@pytest.mark.parametrize("n", SIZES)
def test_alltoall(n):
    teams = pycoll.local_teams(n)
    for count in COUNTS:
        ins = [np.arange(n * count, dtype=np.float32) + 1000 * r for r in range(n)]
        outs = [np.zeros(n * count, np.float32) for _ in range(n)]
        pycoll.wait_all([t.alltoall(ins[r], outs[r]) for r, t in enumerate(teams)])
        for r in range(n):
            want = np.concatenate([ins[s][r * count:(r + 1) * count] for s in range(n)]) if count else outs[r]
            assert np.array_equal(outs[r], want), (r, count)


@pytest.mark.parametrize("n", SIZES)
def test_gather_and_scatter_every_root(n):
    teams = pycoll.local_teams(n)
    for root in roots(n):
        for count in COUNTS:
            ins = [np.full(count, r, np.int16) for r in range(n)]
            out = np.zeros(n * count, np.int16)
            pycoll.wait_all([t.gather(ins[r], out if r == root else None, root=root)
                             for r, t in enumerate(teams)])
            assert np.array_equal(out, np.concatenate(ins) if count else out), (root, count)
            outs = [np.zeros(count, np.int16) for _ in range(n)]
            src = np.repeat(np.arange(n, dtype=np.int16), count)
            pycoll.wait_all([t.scatter(src if r == root else None, outs[r], root=root)
                             for r, t in enumerate(teams)])
            assert all((outs[r] == r).all() for r in range(n)), (root, count)


def test_bad_arguments_raise_before_anything_is_sent():
    a, b = pycoll.local_teams(2)
    with pytest.raises(ValueError, match="root 2"):
        a.bcast(np.zeros(3), root=2)
    with pytest.raises(ValueError, match="not 2 equal blocks"):
        a.allgather(np.zeros(3), np.zeros(5))
    with pytest.raises(ValueError, match="must be rank 0's block"):
        a.allgather(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="must hold 2 blocks"):
        a.reduce_scatter(np.zeros(5), np.zeros(2))
    with pytest.raises(ValueError, match="hold 2 blocks"):
        a.alltoall(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="not 2 equal blocks"):
        a.gather(np.zeros(2), np.zeros(3), root=0)
    with pytest.raises(ValueError, match="counts and displs need one entry per rank"):
        a.allgatherv(np.zeros(2), np.zeros(3), [2])
    with pytest.raises(ValueError, match="block of rank 1 .3 elements at 2. does not fit"):
        a.allgatherv(np.zeros(2), np.zeros(4), [2, 3])
    with pytest.raises(ValueError, match="overlap at element 1"):
        a.allgatherv(np.zeros(2), np.zeros(4), [2, 2], [0, 1])
    with pytest.raises(ValueError, match="sends itself 1 elements but expects 2"):
        a.alltoallv(np.zeros(2), np.zeros(3), [1, 1], [2, 1])
    with pytest.raises(ValueError, match="root needs counts"):
        a.gatherv(np.zeros(2), np.zeros(4), root=0)
    with pytest.raises(ValueError, match="process_vm_readv"):
        a.allgather(np.zeros(2), np.zeros(4), algorithm="cma")
    with pytest.raises(TypeError, match="sequences of integers"):
        a.scatterv(np.zeros(4), np.zeros(2), counts=["x", 2], root=0)
    with pytest.raises(ValueError, match="BAND is not defined"):
        a.reduce(np.zeros(2), np.zeros(2), op="band")
    assert a.next_sequence() == 0 and a.transport.fabric.pending_messages() == 0


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 9, 16])
def test_reduce_knomial_every_radix_and_root(n):
    teams = pycoll.local_teams(n)
    for radix in (2, 3, 4, 8):
        for root in roots(n):
            ins = [make_input("float64", pycoll.ReduceOp.SUM, r, 11) for r in range(n)]
            out = np.zeros(11)
            pycoll.wait_all([t.reduce(ins[r], out if r == root else None, root=root, algorithm="knomial",
                                      radix=radix) for r, t in enumerate(teams)])
            assert_same([out], expected(ins, pycoll.ReduceOp.SUM), f"reduce radix={radix} root={root}")
