"""mpi4py's buffer specifications, read as mpi4py reads them, for :class:`pycoll.mpi.Comm`.

A buffer, ``[buf, MPI.FLOAT]``, ``[buf, count, MPI.FLOAT]``, ``[buf, (count, displ), MPI.FLOAT]``
or ``[buf, count, displ, MPI.FLOAT]`` (:func:`as_buffer`); the vector forms with counts and
displacements (:func:`as_vbuffer`); ``Alltoallw``'s per-block datatypes (:func:`alltoallw_bytes`);
and which objects live in device memory (:func:`device_memory`). Each raises ``ValueError`` or
``TypeError`` for a malformed specification, before anything is sent.

:class:`Specs` makes a Comm's buffer arguments canonical (the same object for the same buffer and
layout, whatever form the caller wrote it in), so that a repeated call is known by the identity of
its arguments and takes the fast path of a repeated array call.
"""

from __future__ import annotations

import array
import itertools
import mmap
import operator
import sys
import weakref
from collections import deque
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import to_numpy_dtype

from pycoll.buffers import as_array, as_bytes, raw_view
from pycoll.persistent import MAX_REPEATED, MAX_REPEATED_BYTES, held_bytes


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


# ---------------------------------------------------------------------- canonical arguments
#: Objects that export host memory by the buffer protocol only: read again at every call (a
#: bytearray may be resized, an mmap closed or a memoryview released between calls).
EXPORTERS = frozenset((bytearray, bytes, memoryview, mmap.mmap, array.array, MPI.buffer))


def hold(held: Optional[list], arg: Any) -> list:
    """``held`` (a new list for None) with what keeps ``arg``'s memory in place while a call that
    has not finished uses it: an export of an :data:`EXPORTERS` object's memory (it then cannot be
    resized or closed, as under mpi4py's own non-blocking and persistent calls), else the object."""
    held = [] if held is None else held
    obj = arg[0] if type(arg) in (list, tuple) and arg else arg
    try:
        held.append(memoryview(obj) if type(obj) in EXPORTERS else obj)
    except (TypeError, ValueError):  # (not valid now: the call's parse raises it)
        pass
    return held


#: Of those, the ones whose address is read through ``MPI.buffer`` (the others have cheaper ways).
_READ_BY_MPI = EXPORTERS - {memoryview, array.array}
_buffer_of = MPI.buffer
#: Counts and displacements given as sequences that may change in place: compared by value.
_SEQUENCES = frozenset((list, array.array, np.ndarray))


def hold_all(args: tuple) -> list:
    """:func:`hold` of every buffer argument among ``args`` (None, MPI.IN_PLACE, ints, ops: none)."""
    held: list = []
    for arg in args:
        if arg is not None and arg is not MPI.IN_PLACE and type(arg) not in (int, MPI.Op, MPI.Datatype):
            hold(held, arg)
    return held


#: What keeps in place the buffers of calls that failed or were interrupted (:func:`keep_failed`):
#: the newest, as many as this (a failed call's team seldom runs many more).
FAILED_KEPT = 256
_failed: deque = deque(maxlen=FAILED_KEPT)


def keep_failed(held: Optional[list]) -> None:
    """Keep ``held`` (see :func:`hold`) past the call it was held for, which failed or was
    interrupted: its collective may still be in flight, and a transport may write into a receive
    buffer later (MPI, UCX: their receives are withdrawn, not always at once), so its memory must
    stay where it is."""
    if held:
        _failed.append(held)


class Spec(tuple):
    """An mpi4py buffer specification as :class:`Specs` keeps it: its buffer a numpy view, its
    counts and displacements copies; never changed, so the same object is the same call."""

    __slots__ = ()


class Specs:
    """A Comm's buffer arguments, made canonical (:meth:`canon`): the same object for the same
    memory and layout, so that a call repeated in any form mpi4py accepts is known by the identity
    of its arguments (:class:`pycoll.persistent.RecentCalls`) and parsed once.

    * An object of :data:`EXPORTERS` becomes a numpy view of its memory that holds no export of it
      (it stays resizable and closable between calls, as with mpi4py's blocking calls). Its address,
      size and writability are read again at every call (``MPI.buffer``); the view is reused only
      while they, and its element format, are the same.
    * A torch tensor in host memory: its DLPack view, reused while its data pointer, size, dtype
      and contiguity are.
    * A list or tuple specification whose buffer is one of those or an ndarray and whose datatype
      is predefined (``[buf, MPI.BYTE]``, ``[buf, count, MPI.BYTE]``, ``[buf, (counts, displs),
      MPI.BYTE]``...) becomes a :class:`Spec` of the buffer's view and copies of its items: the
      same object while the items are equal (the counts compared by value).

    Anything else is returned as it is, and parsed at each call. The views and specifications
    kept are bounded as the repeated calls are (:data:`pycoll.persistent.MAX_REPEATED` of each,
    and :data:`pycoll.persistent.MAX_REPEATED_BYTES` of arrays they keep alive: the oldest go)."""

    def __init__(self) -> None:
        self._views = _Kept()  # id(object) -> (what it was, its view, weakref or None, bytes kept alive)
        self._specs = _Kept()  # items -> (Spec, its buffer's dtype, bytes kept alive)
        # id(list) -> (the list, its items, their Spec, what its buffer was (None: an ndarray),
        # dtype, flags, its sequences and their values, bytes kept alive): the same list object
        # called again
        self._lists = _Kept()

    def canon(self, arg: Any) -> Any:
        """``arg``, canonical: a view, a :class:`Spec`, or ``arg`` itself (an ndarray, None,
        ``MPI.IN_PLACE``, anything not understood here)."""
        kind = type(arg)
        if kind is list or kind is tuple:
            # the same list as before with the same items, its buffer where it was: its Spec
            # (written out: the common case, a loop's, costs what a repeated call may add)
            last = self._lists.get(id(arg))
            if last is not None and last[0] is arg:
                items, buf = last[1], arg[0]
                try:  # (the buffer by identity first: the other items compare by value)
                    same = buf is items[0] and tuple(arg) == items
                except ValueError:  # (an array among them, compared by value)
                    same = False
                if same and last[6]:  # (its counts and displacements: by value)
                    for seq, values in last[6]:
                        if tuple(seq) != values:
                            same = False
                            break
                if same:
                    made, was = last[2], last[3]
                    if was is None:  # (an ndarray: its dtype and flags may change in place)
                        if buf.dtype is last[4] and buf.flags.num == last[5]:
                            return made
                    elif type(buf) in _READ_BY_MPI:
                        mem = _buffer_of(buf)
                        if mem.address == was[0] and mem.nbytes == was[1] and mem.readonly is was[2]:
                            return made
                    elif self._buffer(buf, type(buf)) is made[0]:
                        return made
            return self._spec(arg)
        if kind in _READ_BY_MPI:  # (a bytearray, an mmap... where it was: its view, written out too)
            kept = self._views.get(id(arg))
            if kept is not None:
                try:
                    mem = _buffer_of(arg)
                except (TypeError, ValueError, BufferError):
                    return arg  # (the call's own parse raises it)
                if (mem.address, mem.nbytes, mem.readonly) == kept[0]:
                    return kept[1]
        view = self._buffer(arg, kind)
        return arg if view is None else view

    def _buffer(self, obj: Any, kind: type) -> Optional[np.ndarray]:
        """The canonical view of a buffer object, or None (not one handled here, or not valid
        now: the call's own parse raises its error)."""
        if kind is np.ndarray:
            return obj
        kept = self._views.get(id(obj))
        try:
            if kind in _READ_BY_MPI:
                mem = _buffer_of(obj)
                was: tuple = (mem.address, mem.nbytes, mem.readonly)
                del mem  # (the export ends here)
            elif kind is memoryview:  # (its memory stays where it is until it is released)
                was = (obj.nbytes, obj.format, obj.readonly)  # (raises once released)
                if kept is not None and kept[0] == was and kept[2]() is obj:
                    return kept[1]
            elif kind is array.array:
                address, n = obj.buffer_info()
                was = (address, n * obj.itemsize, obj.typecode)
            elif "torch" in sys.modules and isinstance(obj, sys.modules["torch"].Tensor):
                if obj.device.type != "cpu":
                    return None
                was = (obj.data_ptr(), obj.nbytes, obj.dtype, obj.is_contiguous())
            else:
                return None
        except (TypeError, ValueError, BufferError):
            return None
        if kept is not None and kept[0] == was and kind is not memoryview:
            return kept[1]
        return self._view(obj, kind, was)

    def _view(self, obj: Any, kind: type, was: tuple) -> Optional[np.ndarray]:
        """A new canonical view of ``obj`` (``was``: what :meth:`_buffer` compares it by)."""
        try:
            view = as_array(obj)  # (checks it as any call does; its element type)
            if kind in EXPORTERS:  # (a view that holds nothing: the object stays the caller's)
                mem = MPI.buffer(obj)
                view = raw_view(mem.address, mem.nbytes, view.dtype, mem.readonly)
                del mem
        except Exception:  # noqa: BLE001 - the call's own parse raises it
            return None
        held = 0 if kind in EXPORTERS else held_bytes((view,))
        alive = weakref.ref(obj) if kind is memoryview else None
        self._views.keep(id(obj), (was, view, alive, held))
        return view

    def _spec(self, spec: Any) -> Any:
        """The :class:`Spec` of a list or tuple specification, or ``spec`` itself."""
        if not 2 <= len(spec) <= 4:
            return spec
        buf = spec[0]
        kind = type(buf)
        view = self._buffer(buf, kind)
        if view is None:
            return spec
        # (the dtype by identity: hashing one costs a microsecond; the Spec keeps it alive)
        key: list = [id(view), id(view.dtype), view.flags.num] if view is buf else [id(view)]
        seqs: list = []  # (sequence, its values): what may change in place in the same list
        for item in spec[1:]:
            kind = type(item)
            if kind is int:
                key.append(item)
            elif kind is MPI.Datatype:
                key.append(id(item))  # (the Spec holds it: the id is its own while kept)
            elif kind in _SEQUENCES:  # (counts, displacements: by value)
                seqs.append((item, tuple(item)))
                key.append((kind, seqs[-1][1]))
            elif kind is tuple:
                inner = []
                for x in item:
                    if type(x) in _SEQUENCES:
                        seqs.append((x, tuple(x)))
                        x = seqs[-1][1]
                    inner.append(x)
                key.append((kind, *inner))
            else:
                return spec
        try:
            kept = self._specs.get(tuple(key))
        except TypeError:  # (an item that does not hash: parsed at each call)
            return spec
        if kept is not None and kept[0][0] is view and kept[1] is view.dtype:
            made = kept[0]
        else:
            made = self._made(spec, view, tuple(key))
            if made is None:
                return spec
        kept = None if view is buf else self._views.get(id(buf))
        if view is buf or kept is not None:
            was = None if kept is None else kept[0]
            # (the list keeps its buffer alive, past its Spec should that go first)
            alive = held_bytes((view,)) if kept is None else view.nbytes
            self._lists.keep(id(spec), (spec, tuple(spec), made, was, view.dtype, view.flags.num,
                                        tuple(seqs), alive))
        return made

    def _made(self, spec: Any, view: np.ndarray, key: tuple) -> Optional[Spec]:
        """A new :class:`Spec` of ``spec`` on ``view``, kept at ``key`` (None: not one to keep)."""
        items = []
        for item in spec[1:]:
            kind = type(item)
            if kind is MPI.Datatype and not item.is_predefined:
                return None  # (a derived datatype may be freed and its handle reused)
            if kind in _SEQUENCES:  # (copies: the caller's may change in place)
                item = list(item)
            elif kind is tuple:
                item = tuple(list(x) if type(x) in _SEQUENCES else x for x in item)
            items.append(item)
        made = Spec((view, *items))
        held = 0 if view is not spec[0] else held_bytes((view,))
        self._specs.keep(key, (made, view.dtype, held))
        return made


class _Kept(Dict[Any, tuple]):
    """Entries whose last item is the bytes they keep alive, the oldest first: at most
    :data:`~pycoll.persistent.MAX_REPEATED`, keeping at most
    :data:`~pycoll.persistent.MAX_REPEATED_BYTES` alive."""

    held = 0

    def keep(self, key: Any, entry: tuple) -> None:
        """Keep ``entry`` at ``key`` (not one that alone keeps too much alive); the oldest make room."""
        if entry[-1] > MAX_REPEATED_BYTES:
            return
        old = self.pop(key, None)
        if old is not None:
            self.held -= old[-1]
        while self and (len(self) >= MAX_REPEATED or self.held + entry[-1] > MAX_REPEATED_BYTES):
            try:  # (another thread's call on the same Comm may take it first)
                self.held -= self.pop(next(iter(self)))[-1]
            except (KeyError, RuntimeError, StopIteration):
                break
        self[key] = entry
        self.held += entry[-1]
