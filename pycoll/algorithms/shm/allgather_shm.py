"""Shared-memory allgather(v) for a team on one host (native state machine in ``native/shm.c``).

Chunk by chunk over the largest block (a slot's worth at a time, double buffered): every rank
copies its piece of its block into its slot of the segment (and into its own block of dst, unless
in place), then copies every other rank's piece out of their slots into their blocks of dst.
Blocks may differ in size and need not lie back to back (``args.layout``). Small messages complete
in a single native call when the peers are there.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from pycoll.algorithms.base import CollArgs, SegmentTask, equal_layout
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.dtypes import DTYPE_CODES
from pycoll.tasks.task import Task

NAME = "shm"
COLLECTIVES = ("allgather", "allgatherv")
OPTIONS: Dict[str, Option] = {}
KIND = 4  # PC_COLL_ALLGATHER


class BlockSegmentTask(SegmentTask):
    """A segment collective over blocks (``args.layout``; equal blocks of this rank's block's size
    when None): hands the layout to the native state, which checks it against the buffers again."""

    #: whether the blocks lie in dst (allgather) or in src (reduce_scatter)
    blocks_in_dst = True

    def __init__(self, args: CollArgs, kind: int, name: str) -> None:
        self._layout_key: object = None
        self._layout = self._make_layout(args, name)  # before the segment ticket: errors are clean
        super().__init__(args, kind, name)

    def _make_layout(self, a: CollArgs, name: str) -> np.ndarray:
        key = a.layout if a.layout is not None else ("equal", a.src.size, a.dst.size)
        if a.layout is None:
            mine = a.src.size if self.blocks_in_dst else a.dst.size
            layout = equal_layout(mine, a.size)
        else:
            layout = a.layout
        arr = np.asarray(layout, dtype=np.int64).reshape(-1)
        whole, own = (a.dst, a.src) if self.blocks_in_dst else (a.src, a.dst)
        if arr.size != 2 * a.size or (arr < 0).any():
            raise ValueError(f"{name}: layout {layout!r} is not one (offset, count) per rank")
        offs, cnts = arr[0::2], arr[1::2]
        if (offs + cnts > whole.size).any() or cnts[a.rank] != own.size:
            raise ValueError(f"{name}: layout {layout!r} does not fit buffers of {whole.size} "
                             f"(whole) and {own.size} (this rank's block) elements")
        self._layout_key = key
        return arr.astype(np.uint64)

    def progress(self) -> None:
        if not self.started:
            a = self.args
            st = self.native
            key = a.layout if a.layout is not None else ("equal", a.src.size, a.dst.size)
            if not _same(key, self._layout_key):  # rebound with another layout
                self._layout = self._make_layout(a, self.name)
                self._bound = None  # the number of chunks depends on the layout
            if self._bound is None:
                from pycoll.native import ffi  # noqa: PLC0415 - the compiled module: see pycoll.algorithms.shm

                st.layout = ffi.cast("const uint64_t *", ffi.from_buffer(self._layout))
            st.src_count = a.src.size
        super().progress()


def _same(a: object, b: object) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except ValueError:  # arrays
        return False


class ShmAllgather(BlockSegmentTask):
    def codes(self) -> tuple:
        return 0, DTYPE_CODES[self.args.dst.dtype]  # the dtype gives the element size only


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmAllgather(args, KIND, args.name)
