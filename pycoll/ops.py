"""Reduction operators: which op applies to which dtype, and the kernels that combine buffers.

``ReduceOp`` names the MPI/torch operators; :func:`as_op` also accepts mpi4py's ``MPI.Op`` objects
and names (``"sum"``). :func:`check_op` rejects a pair that makes no sense (BAND on float) with a
``ValueError`` before anything is sent. :func:`reduce_into` combines two buffers in place with
numpy or pycoll's native kernels; float16 and bfloat16 are combined in float32 and rounded once
per step. The dtypes themselves are :mod:`pycoll.dtypes`' (``DTYPES``, ``BFLOAT16`` and
``as_dtype`` are re-exported here).
"""

from __future__ import annotations

import enum
import sys
from typing import Any, Callable, Dict, Optional

import numpy as np

from pycoll.dtypes import BFLOAT16, DTYPE_CODES, DTYPES, HALF, KINDS, as_dtype, check_supported

__all__ = ["BFLOAT16", "DTYPES", "NATIVE_MIN_ELEMENTS", "OP_CODES", "ReduceOp", "Reducer", "as_dtype",
           "as_op", "check_op", "finish_avg", "reduce_into", "reducer", "reference"]


class ReduceOp(enum.Enum):
    """Reduction operators (MPI's, plus AVG as in torch and NCCL)."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    LAND = "land"
    LOR = "lor"
    LXOR = "lxor"


#: ReduceOp -> op code of pycoll's native kernels (PC_SUM... in native/pycoll_native.h: keep in
#: sync); AVG reduces as SUM.
OP_CODES: Dict[ReduceOp, int] = {
    ReduceOp.SUM: 0, ReduceOp.AVG: 0, ReduceOp.PROD: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3,
    ReduceOp.BAND: 4, ReduceOp.BOR: 5, ReduceOp.BXOR: 6, ReduceOp.LAND: 7, ReduceOp.LOR: 8,
    ReduceOp.LXOR: 9,
}

_FLOAT_OPS = {ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG}
_COMPLEX_OPS = {ReduceOp.SUM, ReduceOp.PROD, ReduceOp.AVG}
_INT_OPS = set(ReduceOp)
_BOOL_OPS = {ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR, ReduceOp.LAND,
             ReduceOp.LOR, ReduceOp.LXOR}

_MPI_NAMES = {"SUM": ReduceOp.SUM, "PROD": ReduceOp.PROD, "MIN": ReduceOp.MIN, "MAX": ReduceOp.MAX,
              "BAND": ReduceOp.BAND, "BOR": ReduceOp.BOR, "BXOR": ReduceOp.BXOR, "LAND": ReduceOp.LAND,
              "LOR": ReduceOp.LOR, "LXOR": ReduceOp.LXOR}
_ALIASES = {"product": ReduceOp.PROD, "mean": ReduceOp.AVG, "average": ReduceOp.AVG}


def as_op(op: Any) -> ReduceOp:
    """A :class:`ReduceOp` from a ReduceOp, a name (``"sum"``) or an ``mpi4py.MPI.Op``."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        name = op.strip().lower()
        if name in _ALIASES:
            return _ALIASES[name]
        try:
            return ReduceOp(name)
        except ValueError:
            pass
        raise ValueError(f"unknown reduction {op!r}; use one of {[o.name for o in ReduceOp]}")
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(op, mpi.Op):
        for name, rop in _MPI_NAMES.items():
            if op == getattr(mpi, name):
                return rop
        raise ValueError(f"MPI.Op {op!r} is not supported (user-defined or MAXLOC/MINLOC/REPLACE)")
    raise TypeError(f"op must be a pycoll.ReduceOp, a name or an MPI.Op, not {type(op).__name__}")


_KNOWN_MPI_OPS: set = set()  # the Fortran handles of the MPI ops in _MPI_NAMES, once mpi4py is loaded


def mpi_op_known(op: Any) -> bool:
    """Whether ``op``, an ``mpi4py.MPI.Op``, is one pycoll reduces with (SUM, PROD, MIN, MAX and the
    bitwise and logical ops): not MAXLOC, MINLOC, REPLACE, NO_OP nor a user-defined op."""
    known = _KNOWN_MPI_OPS
    if not known:
        mpi = sys.modules["mpi4py.MPI"]
        known = {getattr(mpi, name).py2f() for name in _MPI_NAMES}
        _KNOWN_MPI_OPS.update(known)  # (whole at once: another thread sees all of it or none)
    return op.py2f() in known


#: the ops each kind of dtype (:data:`pycoll.dtypes.KINDS`) allows.
_VALID = {"float": _FLOAT_OPS, "complex": _COMPLEX_OPS, "int": _INT_OPS, "bool": _BOOL_OPS}
_kind = KINDS.__getitem__  # the kind of a supported dtype (tests use it)


_CHECKED: set = set()


def check_op(op: ReduceOp, dtype: np.dtype) -> None:
    """Raise ``ValueError`` if ``op`` makes no sense for ``dtype``."""
    if (id(op), dtype) in _CHECKED:  # id(): Enum hashes members in Python, slowly
        return
    check_supported(dtype)
    kind = KINDS[dtype]
    if op not in _VALID[kind]:
        allowed = ", ".join(o.name for o in ReduceOp if o in _VALID[kind])
        raise ValueError(f"{op.name} is not defined for {dtype} (allowed for {kind}: {allowed})")
    _CHECKED.add((id(op), dtype))


_UFUNC = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
}
_LOGICAL = {ReduceOp.LAND: np.logical_and, ReduceOp.LOR: np.logical_or, ReduceOp.LXOR: np.logical_xor}


Reducer = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
_REDUCERS: Dict[tuple, Reducer] = {}

#: Set by :mod:`pycoll.lower` while it records an algorithm (None otherwise): an object with
#: ``reducer(op, dtype, fn)`` (returns the kernel to use), ``copy(dst, src)`` and ``avg(buf, n)``,
#: told of what an algorithm computes through this module (and algorithms.base's helpers). Read
#: where a kernel is handed out, not per element: it costs a call nothing when unset.
observer: Any = None


#: From this many elements reductions run in pycoll's native kernels (GIL released); below it
#: numpy's ufuncs, whose call overhead is lower. float16/bfloat16 always go native.
NATIVE_MIN_ELEMENTS = 4096


def reducer(op: ReduceOp, dtype: np.dtype) -> Reducer:
    """The kernel ``fn(a, b, out)`` computing ``out = a (op) b`` for ``dtype`` (cached). AVG
    reduces as SUM: the caller divides once at the end with :func:`finish_avg`."""
    if observer is not None:
        return observer.reducer(op, dtype, _kernel(op, dtype))
    return _kernel(op, dtype)


def _kernel(op: ReduceOp, dtype: np.dtype) -> Reducer:
    fn = _REDUCERS.get((id(op), dtype))
    if fn is not None:
        return fn
    small = _numpy_reducer(op, dtype)
    native_reduce = _native_reducer(op)
    if native_reduce is None:
        fn = small
    elif dtype in HALF:
        fn = native_reduce
    else:
        def fn(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            if out.size < NATIVE_MIN_ELEMENTS:
                small(a, b, out)
            else:
                native_reduce(a, b, out)
    _REDUCERS[(id(op), dtype)] = fn
    return fn


def _native_reducer(op: ReduceOp) -> Optional[Reducer]:
    """The native version of :func:`reducer` (GIL released; any supported dtype, that of ``out``),
    or None without a native build. pycoll.native wraps the same module; it imports this one."""
    try:
        from pycoll._native import ffi, lib  # noqa: PLC0415 - optional: built at install
    except ImportError:  # no native build: numpy only
        return None
    kernel, from_buffer, code = lib.pycoll_reduce, ffi.from_buffer, OP_CODES[op]

    def fn(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        if kernel(code, DTYPE_CODES[out.dtype], from_buffer(out), from_buffer(a), from_buffer(b), out.size):
            # PC_EINVAL, the only error pycoll_reduce returns (check_op lets no such pair through)
            raise ValueError(f"native reduce: invalid argument ({op.name} on {out.dtype})")
    return fn


def _numpy_reducer(op: ReduceOp, dtype: np.dtype) -> Reducer:
    """The numpy version of :func:`reducer`."""
    fn: Reducer
    if op in _LOGICAL:
        logical = _LOGICAL[op]
        if dtype == np.bool_:
            fn = logical
        else:
            def fn(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
                out[...] = logical(a, b)
    elif dtype in HALF:
        ufunc = _UFUNC[op]

        def fn(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            out[...] = ufunc(a.astype(np.float32), b.astype(np.float32))
    elif dtype == np.bool_ and op in (ReduceOp.MIN, ReduceOp.MAX):
        fn = np.logical_and if op is ReduceOp.MIN else np.logical_or
    else:
        ufunc = _UFUNC[op]

        def fn(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            ufunc(a, b, out=out)
    return fn


def reduce_into(dst: np.ndarray, src: np.ndarray, op: ReduceOp, out: Optional[np.ndarray] = None) -> None:
    """``out = dst (op) src`` elementwise (``out`` defaults to ``dst``); AVG reduces as SUM (the
    caller divides once at the end with :func:`finish_avg`)."""
    reducer(op, dst.dtype)(dst, src, dst if out is None else out)


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` (the copies algorithms make, told to :data:`observer` when set, which
    may say to skip it: a recording that only wants the steps)."""
    if observer is not None and observer.copy(dst, src) is False:
        return
    np.copyto(dst, src)


def take_rows(out: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:
    """``out[i] = src[rows[i]]`` for 2-D arrays (a gather of whole rows), as one numpy call; row
    by row through :func:`copy_into` while :data:`observer` is set, so a recording sees each copy."""
    if observer is not None:
        for i, j in enumerate(rows.tolist()):
            copy_into(out[i], src[j])
        return
    src.take(rows, 0, out, "clip")  # (mode "raise" would copy through a temporary)


def put_rows(dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
    """``dst[rows[i]] = src[i]`` for 2-D arrays (a scatter of whole rows), as :func:`take_rows`."""
    if observer is not None:
        for i, j in enumerate(rows.tolist()):
            copy_into(dst[j], src[i])
        return
    dst[rows] = src


def finish_avg(buf: np.ndarray, n: int) -> None:
    """Divide a SUM by ``n`` in place (integers round toward zero, as C and NCCL do)."""
    if n == 1 or buf.size == 0:
        return
    if observer is not None and observer.avg(buf, n) is False:
        return
    if buf.dtype.kind in "iu":
        q = np.abs(buf) // n if buf.dtype.kind == "i" else buf // n
        buf[...] = np.where(buf < 0, -q, q) if buf.dtype.kind == "i" else q
    elif buf.dtype in HALF:
        buf[...] = buf.astype(np.float32) / n
    else:
        np.divide(buf, n, out=buf)


def reference(inputs: list, op: ReduceOp) -> np.ndarray:
    """What a reduction of ``inputs`` should give, combined in rank order (for tests and --check)."""
    acc = inputs[0].copy()
    kernel = _numpy_reducer(op, acc.dtype)  # numpy, independent of the native kernels
    for x in inputs[1:]:
        kernel(acc, x, acc)
    if op is ReduceOp.AVG:
        finish_avg(acc, len(inputs))
    return acc
