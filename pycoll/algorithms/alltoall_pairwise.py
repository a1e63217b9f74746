"""Pairwise-exchange alltoall(v): in step s rank r sends its block for rank r+s and receives the
block of rank r-s; n-1 steps, one peer at a time (bounded memory traffic per step)."""

from __future__ import annotations

from typing import Dict, Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, copy_block
from pycoll.algorithms.options import Option, options
from pycoll.tasks.task import Task

NAME = "pairwise"
COLLECTIVES = ("alltoall", "alltoallv")
OPTIONS: Dict[str, Option] = {}


class PairwiseAlltoall(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch = a.size, a.rank, a.channel
        src = [a.src[off:off + cnt] for off, cnt in a.layout]
        dst = [a.dst[off:off + cnt] for off, cnt in a.rlayout]
        for s in range(1, n):
            to, frm = (rank + s) % n, (rank - s) % n
            step = (ch.isend(as_wire(src[to]), to, s), ch.irecv(as_wire(dst[frm]), frm, s))
            if s == 1:
                copy_block(dst[rank], src[rank])  # while the first exchange runs
            yield step
        if n == 1:
            copy_block(dst[rank], src[rank])


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return PairwiseAlltoall(args, name=args.name)
