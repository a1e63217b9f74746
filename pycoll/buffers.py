"""Turning user buffers (numpy arrays, anything with the buffer protocol) into flat numpy views.

Collectives and transports work on 1-D numpy views of the caller's memory: no copies. A
non-contiguous buffer raises :class:`BufferError` with a clear message instead of being copied
behind the caller's back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_UINT8 = np.dtype(np.uint8)


class BufferError(ValueError):  # noqa: A001 - pycoll.buffers.BufferError, a ValueError
    """A buffer cannot be used as given (non-contiguous, read-only where written, ...)."""


def as_array(obj: Any, *, writable: bool = False, what: str = "buffer") -> np.ndarray:
    """A 1-D numpy view of ``obj`` with its element type (no copy).

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
            raise BufferError(f"{what}: {type(obj).__name__} does not support the buffer protocol") from None
        if not view.c_contiguous:
            raise BufferError(f"{what} is not contiguous; pass a contiguous copy "
                              "(e.g. numpy.ascontiguousarray)")
        arr = np.asarray(view)
    if not arr.flags.c_contiguous:
        raise BufferError(
            f"{what} is not contiguous (shape {arr.shape}, strides {arr.strides}); "
            "pass a contiguous copy (e.g. numpy.ascontiguousarray)"
        )
    if writable and not arr.flags.writeable:
        raise BufferError(f"{what} is read-only but pycoll must write into it")
    return arr.reshape(-1)


def as_bytes(obj: Any, *, writable: bool = False, what: str = "buffer") -> np.ndarray:
    """A 1-D ``uint8`` numpy view of the bytes of ``obj`` (no copy)."""
    arr = as_array(obj, writable=writable, what=what)
    if arr.dtype is _UINT8 or arr.dtype == _UINT8:  # (identity first: comparing costs more)
        return arr
    return arr.view(_UINT8)
