"""Ring allgather(v): rank r's block starts at r; in step s every rank passes the block it
received in the previous step to its right neighbour. n-1 steps, each moving one block per rank
(blocks may differ in size: allgatherv)."""

from __future__ import annotations

from typing import Dict, Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, copy_block
from pycoll.algorithms.options import Option, options
from pycoll.tasks.task import Task

NAME = "ring"
COLLECTIVES = ("allgather", "allgatherv")
OPTIONS: Dict[str, Option] = {}


class RingAllgather(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch = a.size, a.rank, a.channel
        blocks = [a.dst[off:off + cnt] for off, cnt in a.layout]
        right, left = (rank + 1) % n, (rank - 1) % n
        for s in range(n - 1):
            # the first step sends straight from the input, while it is copied into place
            step = (ch.isend(as_wire(a.src if s == 0 else blocks[(rank - s) % n]), right, s),
                    ch.irecv(as_wire(blocks[(rank - s - 1) % n]), left, s))
            if s == 0:
                copy_block(blocks[rank], a.src)
            yield step
        if n == 1:
            copy_block(blocks[rank], a.src)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return RingAllgather(args, name=args.name)
