"""Pairwise-exchange alltoall(v): in step s rank r sends its block for rank r+s and receives the
block of rank r-s; n-1 steps, one peer at a time (bounded memory traffic per step). In place
(sendbuf is recvbuf) it sends from a copy made at the start of each run: the blocks it receives
would overwrite blocks it has yet to send."""

from __future__ import annotations

from typing import Dict, Generator, Optional

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, copy_block
from pycoll.algorithms.options import Option, options
from pycoll.tasks.task import Task

NAME = "pairwise"
COLLECTIVES = ("alltoall", "alltoallv")
OPTIONS: Dict[str, Option] = {}


class PairwiseAlltoall(StepTask):
    def __init__(self, args: CollArgs, name: str) -> None:
        super().__init__(args, name)
        #: (src, dst, layouts, the blocks' wire views to send and to receive into, own blocks):
        #: made once for the buffers a call repeats (n - 1 slices and views each way per call)
        self._views: Optional[tuple] = None

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch = a.size, a.rank, a.channel
        source = a.src
        if source is a.dst and n > 1:
            copy = self.scratch(0, source)  # (kept with the task, counted in its scratch_bytes)
            np.copyto(copy, source)
            source = copy
        views = self._views
        if (views is None or views[0] is not source or views[1] is not a.dst or views[2] is not a.layout
                or views[3] is not a.rlayout):
            src = [source[off:off + cnt] for off, cnt in a.layout]
            dst = [a.dst[off:off + cnt] for off, cnt in a.rlayout]
            views = self._views = (source, a.dst, a.layout, a.rlayout, [as_wire(b) for b in src],
                                   [as_wire(b) for b in dst], dst[rank], src[rank])
        _, _, _, _, sends, recvs, own_dst, own_src = views
        for s in range(1, n):
            to, frm = (rank + s) % n, (rank - s) % n
            step = (ch.isend(sends[to], to, s), ch.irecv(recvs[frm], frm, s))
            if s == 1:
                copy_block(own_dst, own_src)  # while the first exchange runs
            yield step
        if n == 1:
            copy_block(own_dst, own_src)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return PairwiseAlltoall(args, name=args.name)
