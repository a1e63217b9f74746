"""Binomial-tree reduce to a root: in round k a rank whose k-th bit (relative to the root) is set
sends its partial result to the rank 2^k below and is done; the others receive from 2^k above and
combine. log2(n) rounds; only the root's output is written."""

from __future__ import annotations

from typing import Generator

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.ops import ReduceOp, finish_avg, reducer
from pycoll.tasks.task import Task


class BinomialReduce(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, root, ch = a.size, a.rank, a.root, a.channel
        vrank = (rank - root) % n
        acc = a.dst if rank == root else self.scratch(1, a.src)
        if acc is not a.src and a.src.size:
            np.copyto(acc, a.src)
        incoming = self.scratch(0, a.src)
        reduce = reducer(a.op, a.src.dtype)
        mask = 1
        while mask < n:
            if vrank & mask:
                yield (ch.isend(as_wire(acc), (vrank - mask + root) % n, mask),)
                return
            if vrank + mask < n:
                yield (ch.irecv(as_wire(incoming), (vrank + mask + root) % n, mask),)
                reduce(acc, incoming, acc)
            mask <<= 1
        if a.op is ReduceOp.AVG:
            finish_avg(acc, n)


def build(args: CollArgs) -> Task:
    task = BinomialReduce(args, name=args.name)
    n, vrank = args.size, (args.rank - args.root) % args.size
    mask = 1
    while mask < n and not vrank & mask and vrank + mask >= n:
        mask <<= 1  # no child at this distance: the first move is further up
    task.sends_first = mask < n and bool(vrank & mask)
    return task
