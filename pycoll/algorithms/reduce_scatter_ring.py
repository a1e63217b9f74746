"""Ring reduce-scatter (block): in step s rank r sends its partial sum of block r-s-1 to the
right and adds its own contribution to block r-s-2 received from the left; after n-1 steps rank
r holds the reduction of block r."""

from __future__ import annotations

from typing import Generator

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.ops import ReduceOp, finish_avg, reducer
from pycoll.tasks.task import Task


class RingReduceScatter(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch = a.size, a.rank, a.channel
        m = a.dst.size
        own = [a.src[i * m:(i + 1) * m] for i in range(n)]
        if n == 1:
            if m:
                np.copyto(a.dst, own[0])
        else:
            reduce = reducer(a.op, a.dst.dtype)
            bufs = [self.scratch(0, a.dst), self.scratch(1, a.dst)]  # received / partial, alternating
            right, left = (rank + 1) % n, (rank - 1) % n
            send = own[(rank - 1) % n]
            for s in range(n - 1):
                recv = bufs[s % 2]
                yield (ch.isend(as_wire(send), right, s), ch.irecv(as_wire(recv), left, s))
                out = a.dst if s == n - 2 else recv
                reduce(recv, own[(rank - s - 2) % n], out)
                send = out
        if a.op is ReduceOp.AVG:
            finish_avg(a.dst, n)


def build(args: CollArgs) -> Task:
    return RingReduceScatter(args, name=args.name)
