"""Linear gather(v): every rank sends its block to the root, which receives all of them at once."""

from __future__ import annotations

from typing import Dict, Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, copy_block
from pycoll.algorithms.options import Option, options
from pycoll.tasks.task import Task

NAME = "linear"
COLLECTIVES = ("gather", "gatherv")
OPTIONS: Dict[str, Option] = {}


class LinearGather(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, root, ch = a.size, a.rank, a.root, a.channel
        if rank != root:  # needs only its own block: a gatherv's counts may be known at the root only
            yield (ch.isend(as_wire(a.src), root, 0),)
            return
        blocks = [a.dst[off:off + cnt] for off, cnt in a.layout]
        recvs = tuple(ch.irecv(as_wire(blocks[r]), r, 0) for r in range(n) if r != root)
        copy_block(blocks[rank], a.src)  # while the peers' blocks arrive
        yield recvs


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    task = LinearGather(args, name=args.name)
    task.sends_first = args.rank != args.root
    return task
