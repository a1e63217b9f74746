"""Linear gather: every rank sends its block to the root, which receives all of them at once."""

from __future__ import annotations

from typing import Generator

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.tasks.task import Task


class LinearGather(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, root, ch = a.size, a.rank, a.root, a.channel
        m = a.src.size
        if rank != root:
            yield (ch.isend(as_wire(a.src), root, 0),)
            return
        blocks = [a.dst[i * m:(i + 1) * m] for i in range(n)]
        if m:
            np.copyto(blocks[rank], a.src)
        yield tuple(ch.irecv(as_wire(blocks[r]), r, 0) for r in range(n) if r != root)


def build(args: CollArgs) -> Task:
    task = LinearGather(args, name=args.name)
    task.sends_first = args.rank != args.root
    return task
