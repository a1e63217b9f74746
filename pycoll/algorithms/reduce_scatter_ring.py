"""Ring reduce-scatter (block, and v with unequal blocks): in step s rank r sends its partial
sum of block r-s-1 to the right and adds its own contribution to block r-s-2 received from the
left; after n-1 steps rank r holds the reduction of block r."""

from __future__ import annotations

from typing import Dict, Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.algorithms.options import Option, options
from pycoll.ops import ReduceOp, copy_into, finish_avg, reducer
from pycoll.tasks.task import Task

NAME = "ring"
COLLECTIVES = ("reduce_scatter", "reduce_scatterv")
OPTIONS: Dict[str, Option] = {}


class RingReduceScatter(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch = a.size, a.rank, a.channel
        own = [a.src[off:off + cnt] for off, cnt in a.layout]
        if n == 1:
            if a.dst.size:
                copy_into(a.dst, own[0])
        else:
            reduce = reducer(a.op, a.dst.dtype)
            most = a.src[:max(cnt for _, cnt in a.layout)]
            bufs = [self.scratch(0, most), self.scratch(1, most)]  # received / partial, alternating
            right, left = (rank + 1) % n, (rank - 1) % n
            send = own[(rank - 1) % n]
            for s in range(n - 1):
                b = (rank - s - 2) % n  # the block received in this step
                recv = bufs[s % 2][:a.layout[b][1]]
                yield (ch.isend(as_wire(send), right, s), ch.irecv(as_wire(recv), left, s))
                out = a.dst if s == n - 2 else recv
                reduce(recv, own[b], out)
                send = out
        if a.op is ReduceOp.AVG:
            finish_avg(a.dst, n)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return RingReduceScatter(args, name=args.name)
