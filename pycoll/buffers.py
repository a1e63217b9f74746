"""Turning user buffers (numpy arrays, anything with the buffer protocol, DLPack or numpy's array
interface in host memory) into flat numpy views, and allocating the collectives' own scratch.

Collectives and transports work on 1-D numpy views of the caller's memory, in memory order: no
copies. A non-contiguous buffer (neither C- nor Fortran-contiguous) raises :class:`BufferError`
with a clear message instead of being copied behind the caller's back.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

import numpy as np

from pycoll.errors import BufferError  # noqa: A004 - pycoll.buffers.BufferError stays importable

_UINT8 = np.dtype(np.uint8)
#: Scratch of at least this many bytes is mapped on its own (see :func:`scratch_array`).
MAPPED_SCRATCH_BYTES = 128 << 10


def scratch_array(size: int, dtype: Any) -> np.ndarray:
    """A new array of ``size`` elements of ``dtype`` for a collective's scratch, which outlives the
    call (kept collectives keep theirs). A large one is mapped on its own, off the malloc heap: as
    a program frees large arrays, glibc serves ever larger ones from its heap, and a kept buffer in
    the middle of the heap would keep the free memory around it resident for good."""
    dtype = np.dtype(dtype)
    nbytes = size * dtype.itemsize
    if nbytes < MAPPED_SCRATCH_BYTES:
        return np.empty(size, dtype)
    mapped = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(mapped, dtype, size)  # (unmapped when the array goes)


try:  # (the address through cffi: a third of what numpy's __array_interface__ costs)
    from pycoll._native import ffi as _ffi
except ImportError:  # pragma: no cover - the native module is built at install
    _ffi = None


def address(arr: np.ndarray) -> int:
    """Where ``arr``'s first element is in memory (zero-size arrays included)."""
    if _ffi is not None and arr.flags.c_contiguous:
        return int(_ffi.cast("uintptr_t", _ffi.from_buffer(arr)))
    return arr.__array_interface__["data"][0]


def raw_view(address: int, nbytes: int, dtype: Any, readonly: bool) -> np.ndarray:
    """A 1-D view of ``nbytes`` of memory at ``address`` as ``dtype``, holding nothing of its owner:
    whoever keeps it must know, before each use, that the memory is still there (see
    :class:`pycoll.mpispec.Specs`, which checks an object's address and size at every call)."""
    if not nbytes:
        return np.empty(0, dtype)
    if _ffi is not None:
        raw: Any = _ffi.buffer(_ffi.cast("char *", address), nbytes)
    else:  # pragma: no cover - the native module is built at install
        raw = (ctypes.c_char * nbytes).from_address(address)
    view = np.frombuffer(raw, dtype)
    if readonly:
        view.flags.writeable = False
    return view


def unowned(arr: np.ndarray) -> bool:
    """Whether ``arr`` is (a view of) a :func:`raw_view`: it keeps no memory alive."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return _RAW is not None and type(arr.base) is _RAW


_RAW = type(_ffi.buffer(_ffi.new("char[]", 1))) if _ffi is not None else None


def as_array(obj: Any, *, writable: bool = False, what: str = "buffer") -> np.ndarray:
    """A 1-D numpy view of ``obj`` with its element type (no copy), in memory order (a
    Fortran-ordered array's elements as they lie, as mpi4py and MPI read it).

    Raises :class:`BufferError` if ``obj`` is not contiguous, or is read-only and ``writable``.
    """
    if type(obj) is np.ndarray and obj.ndim == 1 and obj.flags.c_contiguous and (
            obj.flags.writeable or not writable):
        return obj  # the common case, checked first
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            arr = _exported(obj, what)
        else:
            if not view.contiguous:
                raise BufferError(f"{what} is not contiguous; pass a contiguous copy "
                                  "(e.g. numpy.ascontiguousarray)")
            arr = np.asarray(view)
    if not arr.flags.c_contiguous and arr.flags.f_contiguous:
        arr = arr.T  # (Fortran order: its elements in memory order, as MPI reads a buffer)
    if not arr.flags.c_contiguous:
        raise BufferError(
            f"{what} is not contiguous (shape {arr.shape}, strides {arr.strides}); "
            "pass a contiguous copy (e.g. numpy.ascontiguousarray)"
        )
    if writable and not arr.flags.writeable:
        raise BufferError(f"{what} is read-only but pycoll must write into it")
    return arr.reshape(-1)


def _exported(obj: Any, what: str) -> np.ndarray:
    """A numpy view of host memory exported other than by the buffer protocol: DLPack
    (``__dlpack__``, read as mpi4py reads it: the tensor's memory, writable, the capsule kept alive
    with the view and left to its producer to release) or numpy's ``__array_interface__``."""
    if hasattr(obj, "__dlpack__"):
        return dlpack_view(obj, what)
    if hasattr(obj, "__array_interface__"):
        return np.asarray(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        raise BufferError(f"{what}: {type(obj).__name__} is device memory (only host memory here)")
    raise BufferError(f"{what}: {type(obj).__name__} does not support the buffer protocol")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


#: DLPack's type codes -> numpy's kind letters (int, uint, float, complex, bool).
_DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _Holder(np.ndarray):
    """A view that keeps its DLPack capsule (and so the producer's memory) alive."""

    capsule: Any = None


def dlpack_view(obj: Any, what: str = "buffer") -> np.ndarray:
    """A writable 1-D numpy view of the host memory of a DLPack exporter (C-contiguous only)."""
    device = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else 1
    if device not in (1, 3):  # kDLCPU, kDLCUDAHost
        raise BufferError(f"{what}: DLPack memory on device type {device} (only host memory here)")
    capsule = obj.__dlpack__()
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))  # DLManagedTensor starts with it
    kind, size, lanes = _DL_KINDS.get(tensor.dtype.code), tensor.dtype.bits // 8, tensor.dtype.lanes
    if kind == "f" and lanes == 2:  # (a complex number as two lanes of its float, as some exporters say it)
        kind, size, lanes = "c", 2 * size, 1
    try:
        dtype = np.dtype(f"{kind}{size}" if kind != "b" else "?")
    except TypeError:
        dtype = None
    if dtype is None or kind is None or lanes != 1 or tensor.dtype.bits % 8:
        raise BufferError(f"{what}: DLPack type (code {tensor.dtype.code}, {tensor.dtype.bits} bits, "
                          f"{tensor.dtype.lanes} lanes) has no numpy equivalent")
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if tensor.strides and count > 1:
        expected = 1
        for i in reversed(range(tensor.ndim)):
            if shape[i] != 1 and tensor.strides[i] != expected:
                raise BufferError(f"{what}: DLPack tensor is not contiguous; pass a contiguous copy")
            expected *= shape[i]
    nbytes = count * dtype.itemsize
    address = (tensor.data or 0) + tensor.byte_offset
    raw = (ctypes.c_char * nbytes).from_address(address) if nbytes else bytearray()
    arr = np.frombuffer(raw, dtype=dtype, count=count).view(_Holder)
    arr.capsule = capsule
    return arr


def as_bytes(obj: Any, *, writable: bool = False, what: str = "buffer") -> np.ndarray:
    """A 1-D ``uint8`` numpy view of the bytes of ``obj`` (no copy)."""
    arr = as_array(obj, writable=writable, what=what)
    if arr.dtype is _UINT8 or arr.dtype == _UINT8:  # (identity first: comparing costs more)
        return arr
    return arr.view(_UINT8)


def aliasing(src: Any, dst: Any) -> Any:
    """How a call's ``src`` lies in its ``dst``, as its plan-cache key tells calls apart: ``"same"``
    (in place), ``("in", byte offset)`` (a view inside it, as an allgather's own block) or None
    (apart). A native program reads a ``src`` inside ``dst`` from ``dst`` (see
    :mod:`pycoll.lower.record`): a call whose ``src`` is apart must not reuse it. Two arrays that
    own their memory are apart at once (no address is looked up)."""
    if src is dst:
        return "same"
    if src.base is None and dst.base is None or not np.may_share_memory(src, dst):
        return None  # (the bounds test first: an address costs more)
    start, end = address(src), address(dst)
    return ("in", start - end) if end <= start and start + src.nbytes <= end + dst.nbytes else None
