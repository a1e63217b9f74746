"""mpi4py's buffer specifications, read as mpi4py reads them, for :class:`pycoll.mpi.Comm`.

A buffer, ``[buf, MPI.FLOAT]``, ``[buf, count, MPI.FLOAT]``, ``[buf, (count, displ), MPI.FLOAT]``
or ``[buf, count, displ, MPI.FLOAT]`` (:func:`as_buffer`); the vector forms with counts and
displacements (:func:`as_vbuffer`); ``Alltoallw``'s per-block datatypes (:func:`alltoallw_bytes`);
and which objects live in device memory (:func:`device_memory`). Each raises ``ValueError`` or
``TypeError`` for a malformed specification, before anything is sent.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import to_numpy_dtype

from pycoll.buffers import as_array, as_bytes


def _typed(buf: Any, datatype: Any, writable: bool, what: str) -> np.ndarray:
    """The 1-D numpy view of ``buf``, of ``datatype``'s numpy type when one is given."""
    if datatype is None:
        return as_array(buf, writable=writable, what=what)
    return as_bytes(buf, writable=writable, what=what).view(to_numpy_dtype(datatype))


def _index(value: Any, what: str, name: str) -> int:
    """``value`` as a non-negative int (mpi4py's counts and displacements)."""
    try:
        out = operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: {name} must be an integer, got {value!r}") from None
    if out < 0:
        raise ValueError(f"{what}: negative {name} {out}")
    return out


def _unpack(spec: Sequence[Any], pairs: tuple, what: str) -> tuple:
    """``(buf, count, displ, datatype)`` of an mpi4py buffer specification list (2 to 4 items), as
    mpi4py unpacks one: a count that is an instance of ``pairs`` is ``(count, displ)`` (mpi4py
    takes a list or tuple there for one buffer, only a tuple for a vector buffer)."""
    count = displ = datatype = None
    if len(spec) == 2:
        buf, count = spec
        if isinstance(count, MPI.Datatype):
            count, datatype = None, count
        elif isinstance(count, pairs):
            count, displ = count
    elif len(spec) == 3:
        buf, count, datatype = spec
        if isinstance(count, pairs):
            count, displ = count
    elif len(spec) == 4:
        buf, count, displ, datatype = spec
    else:
        raise ValueError(f"{what}: expected 2 to 4 items ([buf, count, displ, datatype] or a shorter "
                         f"form), got {len(spec)}")
    if datatype is not None and not isinstance(datatype, MPI.Datatype):
        raise TypeError(f"{what}: the datatype must be an MPI.Datatype, got {datatype!r}")
    return buf, count, displ, datatype


def as_buffer(spec: Any, *, blocks: int = 0, writable: bool = False, what: str = "buffer") -> np.ndarray:
    """A typed 1-D numpy view of an mpi4py buffer specification, read as mpi4py reads one
    (``message_simple``): ``buf``, ``[buf, datatype]``, ``[buf, count]``, ``[buf, (count, displ)]``,
    ``[buf, count, datatype]``, ``[buf, (count, displ), datatype]`` or ``[buf, count, displ,
    datatype]``; the displacement is in elements. ``blocks`` > 1: the buffer holds that many blocks
    (one per rank, as an alltoall's or a gather root's), and a given count is one block's, so the
    view is ``count * blocks`` elements."""
    if not isinstance(spec, (list, tuple)):
        return as_array(spec, writable=writable, what=what)
    buf, count, displ, datatype = _unpack(spec, (list, tuple), what)
    arr = _typed(buf, datatype, writable, what)
    start = 0 if displ is None else _index(displ, what, "displacement")
    if start > arr.size:
        raise ValueError(f"{what}: displacement {start} out of bounds of {arr.size} elements")
    if count is None:
        return arr[start:]
    n = _index(count, what, "count") * max(1, blocks)
    if start + n > arr.size:
        raise ValueError(f"{what}: count {count}{f' x {blocks} blocks' if blocks > 1 else ''} at "
                         f"displacement {start} exceeds the buffer of {arr.size} elements")
    return arr[start:start + n]


# ---------------------------------------------------------------------- device memory, Alltoallw


def device_memory(obj: Any) -> bool:
    """Whether ``obj`` is a buffer in device memory only (``__cuda_array_interface__``, no host
    buffer or array interface)."""
    if not hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__array_interface__"):
        return False
    try:
        memoryview(obj)
    except TypeError:
        return True
    return False


def _wspec(spec: Any, size: int, writable: bool, what: str) -> Optional[tuple]:
    """``(bytes, counts, displs)`` (in bytes) of an ``Alltoallw`` buffer specification,
    ``(buf, (counts, displs), datatypes)`` or ``(buf, counts, displs, datatypes)``; None when a
    datatype is not a predefined one, the buffer is ``MPI.BOTTOM`` (MPI walks those) or in device
    memory."""
    if not isinstance(spec, (list, tuple)) or len(spec) not in (3, 4):
        raise ValueError(f"{what}: expected (buf, (counts, displs), datatypes) or (buf, counts, displs, "
                         f"datatypes), got {spec!r}")
    buf, counts, displs, types = (spec[0], *spec[1], spec[2]) if len(spec) == 3 else spec
    if buf is MPI.BOTTOM or device_memory(buf):
        return None
    if isinstance(types, MPI.Datatype):
        types = [types] * size
    if len(counts) != size or len(displs) != size or len(types) != size:
        raise ValueError(f"{what}: {size} counts, displacements and datatypes expected")
    if any(not isinstance(t, MPI.Datatype) or t.Get_envelope()[-1] != MPI.COMBINER_NAMED for t in types):
        return None
    nbytes = [_index(c, what, "count") * t.Get_size() for c, t in zip(counts, types)]
    offsets = [_index(d, what, "displacement") for d in displs]
    return as_bytes(buf, writable=writable, what=what), nbytes, offsets


def alltoallw_bytes(sendbuf: Any, recvbuf: Any, size: int, copies: Optional[list] = None) -> Optional[tuple]:
    """The arguments of the byte ``team.alltoallv`` an ``Alltoallw`` is (``MPI.IN_PLACE``: the
    receive buffer sends a copy of itself, recorded in ``copies`` as ``(copy, whole)``), or None
    when it goes to MPI."""
    recv = _wspec(recvbuf, size, True, "recvbuf")
    if recv is None:
        return None
    if sendbuf is MPI.IN_PLACE:
        send = (recv[0].copy(), recv[1], recv[2])
        if copies is not None:
            copies.append((send[0], recv[0]))
    else:
        send = _wspec(sendbuf, size, False, "sendbuf")
        if send is None:
            return None
    return send[0], recv[0], send[1], recv[1], send[2], recv[2]


VBuffer = Tuple[np.ndarray, List[int], List[int]]


def as_vbuffer(spec: Any, size: int, *, writable: bool = False, what: str = "buffer") -> VBuffer:
    """``(array, counts, displs)`` of an mpi4py vector buffer specification, read as mpi4py reads
    one (``message_vector``): ``buf``, ``[buf, counts]``, ``[buf, (counts, displs)]``, ``[buf,
    datatype]``, ``[buf, counts, datatype]``, ``[buf, (counts, displs), datatype]`` or ``[buf,
    counts, displs, datatype]``. Counts may be one int (every block that long), displacements one
    int (block i at ``i * displs``); without counts the buffer is split into ``size`` blocks as
    evenly as it goes (the first ``len % size`` one longer); without displacements the blocks lie
    back to back."""
    buf, counts, displs, datatype = spec, None, None, None
    if isinstance(spec, (list, tuple)):
        buf, counts, displs, datatype = _unpack(spec, (tuple,), what)
    arr = _typed(buf, datatype, writable, what)
    if counts is None:
        counts = [arr.size // size + (arr.size % size > i) for i in range(size)]
    elif isinstance(counts, (int, np.integer)):
        counts = [_index(counts, what, "count")] * size
    else:
        counts = [_index(c, what, "count") for c in counts]
        if len(counts) != size:
            raise ValueError(f"{what}: {len(counts)} counts for {size} ranks")
    if displs is None:
        displs = list(itertools.accumulate([0] + counts[:-1]))
    elif isinstance(displs, (int, np.integer)):
        displs = [_index(displs, what, "displacement") * i for i in range(size)]
    else:
        displs = [_index(d, what, "displacement") for d in displs]
        if len(displs) != size:
            raise ValueError(f"{what}: {len(displs)} displacements for {size} ranks")
    return arr, counts, displs
