"""Shared helpers for collective tests: inputs whose reductions are exact in every dtype."""

import numpy as np

from pycoll.ops import _VALID, DTYPES, ReduceOp, _kind, reference

ALL_DTYPES = list(DTYPES)


def valid_ops(dtype):
    return [op for op in ReduceOp if op in _VALID[_kind(np.dtype(DTYPES[dtype]))]]


def make_input(dtype, op, rank, count, seed=0):
    """Rank ``rank``'s input: small integers (exact in float16/bfloat16 sums of up to 64 ranks),
    +-1 and 1/2 for products, random bits for bitwise ops, booleans for bool."""
    dt = DTYPES[dtype]
    rng = np.random.default_rng(seed * 1000 + rank)
    if dt == np.bool_:
        return rng.random(count) < 0.5
    if op in (ReduceOp.PROD,):
        vals = rng.choice([1, 1, 1, -1, 2] if dt.kind != "u" else [1, 1, 1, 2], count)
        if dt.kind in "iu" and dt.itemsize == 1:
            vals = rng.choice([1, 1, 1, -1] if dt.kind == "i" else [1], count)
        arr = vals.astype(dt) if dt.kind != "c" else (vals + 0j).astype(dt)
        return arr
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR, ReduceOp.LAND, ReduceOp.LOR, ReduceOp.LXOR):
        hi = min(np.iinfo(dt).max, 1 << 16) if dt.kind in "iu" else 2
        return rng.integers(0, hi, count).astype(dt)
    lo, hi = (-3, 4) if dt.kind in "ifc" or dtype in ("bfloat16",) else (0, 4)
    vals = rng.integers(lo, hi, count)
    if dt.kind == "c":
        return (vals + 1j * rng.integers(lo, hi, count)).astype(dt)
    return vals.astype(dt)


def expected(inputs, op):
    return reference([x.copy() for x in inputs], op)


def assert_same(outputs, want, what=""):
    for r, out in enumerate(outputs):
        got = np.asarray(out)
        if got.dtype.kind == "f" or got.dtype.name == "bfloat16":
            ok = np.array_equal(got.astype(np.float64), want.astype(np.float64), equal_nan=True)
        else:
            ok = np.array_equal(got, want)
        assert ok, f"{what}: rank {r} differs: got {got[:8]} want {want[:8]}"
