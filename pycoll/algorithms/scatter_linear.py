"""Linear scatter(v): the root sends every rank its block at once."""

from __future__ import annotations

from typing import Dict, Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, copy_block
from pycoll.algorithms.options import Option, options
from pycoll.tasks.task import Task

NAME = "linear"
COLLECTIVES = ("scatter", "scatterv")
OPTIONS: Dict[str, Option] = {}


class LinearScatter(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, root, ch = a.size, a.rank, a.root, a.channel
        if rank != root:
            yield (ch.irecv(as_wire(a.dst), root, 0),)
            return
        blocks = [a.src[off:off + cnt] for off, cnt in a.layout]
        sends = tuple(ch.isend(as_wire(blocks[r]), r, 0) for r in range(n) if r != root)
        copy_block(a.dst, blocks[rank])  # while the blocks leave
        yield sends


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    task = LinearScatter(args, name=args.name)
    task.sends_first = args.rank == args.root
    return task
