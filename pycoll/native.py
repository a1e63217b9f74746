"""The compiled part of pycoll (``pycoll._native``, built by cffi at install): reduction kernels
and the shared-memory collectives. This module maps numpy dtypes and ReduceOps to its codes."""

from __future__ import annotations

from typing import Dict

import numpy as np

from pycoll.errors import PycollError
from pycoll.ops import BFLOAT16, ReduceOp

try:
    from pycoll._native import ffi, lib
except ImportError as exc:  # pragma: no cover - only without a build
    raise PycollError(f"pycoll's native module is not built ({exc}); reinstall: pip install -e .") from exc

DTYPE_CODES: Dict[np.dtype, int] = {
    np.dtype(name): code for code, name in enumerate(
        ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16"))
}
DTYPE_CODES[BFLOAT16] = 9
for _code, _name in enumerate(("float32", "float64", "complex64", "complex128", "bool"), start=10):
    DTYPE_CODES[np.dtype(_name)] = _code

OP_CODES: Dict[ReduceOp, int] = {
    ReduceOp.SUM: 0, ReduceOp.AVG: 0, ReduceOp.PROD: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3,
    ReduceOp.BAND: 4, ReduceOp.BOR: 5, ReduceOp.BXOR: 6, ReduceOp.LAND: 7, ReduceOp.LOR: 8,
    ReduceOp.LXOR: 9,
}

ERRORS = {-1: "invalid argument", -2: "the segment header is not valid (corrupted or not pycoll's)",
          -3: "an offset or size in the segment is out of bounds",
          -4: "a peer's control block holds an impossible value"}


def pointer(arr: np.ndarray) -> ffi.CData:
    """A ``char *`` to the first byte of a contiguous array (zero-size arrays included)."""
    return ffi.cast("char *", ffi.from_buffer(arr))


def address(arr: np.ndarray) -> int:
    """The address of an array's first byte (cheaper than ``arr.ctypes.data``)."""
    return int(ffi.cast("uintptr_t", ffi.from_buffer(arr)))


def reduce(op: ReduceOp, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a (op) b`` with the native kernels (GIL released); AVG reduces as SUM."""
    rc = lib.pycoll_reduce(OP_CODES[op], DTYPE_CODES[out.dtype], pointer(out), pointer(a), pointer(b),
                           out.size)
    if rc:
        raise ValueError(f"native reduce: {ERRORS.get(rc, rc)} ({op.name} on {out.dtype})")
