"""The base of the segment collectives over blocks (allgather(v), reduce_scatter(v), gather(v),
scatter(v), alltoall(v)): it checks the blocks against the buffers in Python (a clear error before
anything is sent) and hands them to the native state machine, which checks them again.

Not an algorithm itself (no ``NAME``): the ``*_shm`` modules of this package subclass
:class:`BlockSegmentTask`.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from pycoll.algorithms.base import CollArgs, SegmentTask, equal_layout


def _same(a: object, b: object) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except ValueError:  # arrays
        return False


def checked_blocks(layout: Any, n: int, whole: int, own: Optional[Tuple[int, int]], name: str,
                   what: str) -> np.ndarray:
    """``layout`` as the native form (offset, count per rank, uint64), checked: one block per rank,
    inside a buffer of ``whole`` elements, block ``own[0]`` of ``own[1]`` elements."""
    arr = np.asarray(layout, dtype=np.int64).reshape(-1)
    if arr.size != 2 * n or (arr < 0).any():
        raise ValueError(f"{name}: layout {layout!r} is not one (offset, count) per rank")
    offs, cnts = arr[0::2], arr[1::2]
    if (offs + cnts > whole).any() or (own is not None and cnts[own[0]] != own[1]):
        raise ValueError(f"{name}: layout {layout!r} does not fit {what} of {whole} elements"
                         + (f" with block {own[0]} of {own[1]} elements" if own is not None else ""))
    return arr.astype(np.uint64)


class BlockSegmentTask(SegmentTask):
    """A segment collective over blocks (``args.layout``; equal blocks when None), described to
    the native state by :meth:`layouts`: the blocks it sends from or receives into, as the native
    ``layout`` and ``rlayout`` (see ``pc_shm_coll_t`` in ``native/pycoll_native.h``)."""

    def __init__(self, args: CollArgs, kind: int, name: str) -> None:
        self.name = name  # for the errors of layouts(); Task.__init__ sets it again
        self._layout_key: object = self._key(args)
        # before the segment ticket (SegmentTask.__init__): errors leave the segment's order as it was
        self._layout, self._rlayout = self.layouts(args)
        super().__init__(args, kind, name)

    @staticmethod
    def _key(a: CollArgs) -> object:
        return (a.layout, a.rlayout) if a.layout is not None else ("equal", a.src.size, a.dst.size)

    def layouts(self, a: CollArgs) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """(layout, rlayout) in native form, checked against ``a``'s buffers; None: not used."""
        raise TypeError(f"{type(self).__name__} must define layouts()")

    def progress(self) -> None:
        if not self.started:
            a = self.args
            key = self._key(a)
            if not _same(key, self._layout_key):  # rebound with other blocks
                self._layout, self._rlayout = self.layouts(a)
                self._layout_key = key
                self._bound = None  # the number of chunks depends on the blocks
            if self._bound is None:
                from pycoll.native import ffi  # noqa: PLC0415 - the compiled module: see pycoll.algorithms.shm

                st = self.native
                null = ffi.NULL
                st.layout = (null if self._layout is None
                             else ffi.cast("const uint64_t *", ffi.from_buffer(self._layout)))
                st.rlayout = (null if self._rlayout is None
                              else ffi.cast("const uint64_t *", ffi.from_buffer(self._rlayout)))
                st.src_count = a.src.size
        super().progress()


def dst_blocks(a: CollArgs, name: str) -> np.ndarray:
    """Blocks of dst, this rank's the size of src (allgather(v); gather(v) at the root)."""
    layout = a.layout if a.layout is not None else equal_layout(a.src.size, a.size)
    return checked_blocks(layout, a.size, a.dst.size, (a.rank, a.src.size), name, "recvbuf")


def src_blocks(a: CollArgs, name: str, own: Optional[int] = None) -> np.ndarray:
    """Blocks of src, block ``own`` (default: this rank's) the size of dst (reduce_scatter(v);
    scatter(v) at the root)."""
    layout = a.layout if a.layout is not None else equal_layout(a.dst.size, a.size)
    block = (a.rank if own is None else own, a.dst.size)
    return checked_blocks(layout, a.size, a.src.size, block, name, "sendbuf")
