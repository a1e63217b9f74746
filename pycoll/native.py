"""The compiled part of pycoll (``pycoll._native``, built by cffi at install): reduction kernels
and the shared-memory collectives. This module wraps it: pointers to arrays, error codes, and the
codes of dtypes and ReduceOps (``DTYPE_CODES`` from :mod:`pycoll.dtypes`, ``OP_CODES`` from
:mod:`pycoll.ops`, re-exported here)."""

from __future__ import annotations

import numpy as np

from pycoll.buffers import address  # (re-exported: the shm transport's)
from pycoll.dtypes import DTYPE_CODES
from pycoll.errors import PycollError
from pycoll.ops import OP_CODES, ReduceOp

try:
    from pycoll._native import ffi, lib
except ImportError as exc:  # pragma: no cover - only without a build
    raise PycollError(f"pycoll's native module is not built ({exc}); reinstall: pip install -e .") from exc

__all__ = ["DTYPE_CODES", "ERRORS", "OP_CODES", "address", "ffi", "lib", "pointer", "reduce"]

ERRORS = {-1: "invalid argument", -2: "the segment header is not valid (corrupted or not pycoll's)",
          -3: "an offset or size in the segment is out of bounds",
          -4: "a peer's control block holds an impossible value",
          -5: "the ranks disagree on the sizes of the blocks (counts) of this collective",
          -6: "reading or writing a peer's memory (process_vm_readv/writev) failed",
          -7: "the ranks called different collectives, or the same one with different arguments",
          -8: "out of memory for a native work buffer",
          -9: "an earlier gather's calls differ (this rank went on from it without the root)"}


def pointer(arr: np.ndarray) -> ffi.CData:
    """A ``char *`` to the first byte of a contiguous array (zero-size arrays included)."""
    return ffi.cast("char *", ffi.from_buffer(arr))


def reduce(op: ReduceOp, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a (op) b`` with the native kernels (GIL released); AVG reduces as SUM."""
    rc = lib.pycoll_reduce(OP_CODES[op], DTYPE_CODES[out.dtype], pointer(out), pointer(a), pointer(b),
                           out.size)
    if rc:
        raise ValueError(f"native reduce: {ERRORS.get(rc, rc)} ({op.name} on {out.dtype})")
