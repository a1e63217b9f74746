"""Ring allgather(v): rank r's block starts at r; in step s every rank passes the block it
received in the previous step to its right neighbour. n-1 steps, each moving one block per rank
(blocks may differ in size: allgatherv)."""

from __future__ import annotations

from typing import Generator

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.tasks.task import Task


class RingAllgather(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch = a.size, a.rank, a.channel
        blocks = [a.dst[off:off + cnt] for off, cnt in a.layout]
        if a.src is not blocks[rank] and a.src.size:
            np.copyto(blocks[rank], a.src)
        right, left = (rank + 1) % n, (rank - 1) % n
        for s in range(n - 1):
            yield (ch.isend(as_wire(blocks[(rank - s) % n]), right, s),
                   ch.irecv(as_wire(blocks[(rank - s - 1) % n]), left, s))


def build(args: CollArgs) -> Task:
    return RingAllgather(args, name=args.name)
