"""K-nomial tree broadcast (binomial for radix 2): log_k(n) rounds; a rank receives the buffer
from its parent, then sends it to its children, farthest subtree first."""

from __future__ import annotations

from typing import Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.tasks.task import Task

DEFAULT_RADIX = 2


class KnomialBcast(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, root, ch = a.size, a.rank, a.root, a.channel
        radix = max(2, int(a.options.get("radix", DEFAULT_RADIX)))
        if n == 1 or a.dst.size == 0:
            return
        wire = as_wire(a.dst)
        vrank = (rank - root) % n
        # find the parent: the lowest non-zero digit of vrank in base radix
        dist = 1
        while dist < n:
            if (vrank // dist) % radix:
                parent = vrank - ((vrank // dist) % radix) * dist
                yield (ch.irecv(wire, (parent + root) % n, 0),)
                break
            dist *= radix
        # children: vrank + j * d for every d below that digit's place
        dist //= radix
        sends = []
        while dist >= 1:
            for j in range(1, radix):
                child = vrank + j * dist
                if child < n:
                    sends.append(ch.isend(wire, (child + root) % n, 0))
            dist //= radix
        if sends:
            yield sends


def build(args: CollArgs) -> Task:
    task = KnomialBcast(args, name=args.name)
    task.sends_first = args.rank == args.root
    return task
