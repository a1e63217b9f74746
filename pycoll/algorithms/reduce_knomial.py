"""K-nomial tree reduce to a root (binomial for radix 2, the default; ``radix=`` option): at
distance d = radix^k a rank whose k-th base-radix digit (relative to the root) is non-zero sends
its partial result to the rank digit * d below and is done; the others receive from their children
vrank + j * d (j = 1..radix-1) and combine them in increasing order. log_radix(n) rounds; only the
root's output is written."""

from __future__ import annotations

from typing import Generator

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.ops import ReduceOp, finish_avg, reducer
from pycoll.tasks.task import Task

DEFAULT_RADIX = 2


def radix_of(args: CollArgs) -> int:
    return max(2, int(args.options.get("radix", DEFAULT_RADIX)))


class KnomialReduce(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, root, ch = a.size, a.rank, a.root, a.channel
        radix = radix_of(a)
        vrank = (rank - root) % n
        acc = a.dst if rank == root else self.scratch(radix, a.src)
        if acc is not a.src and a.src.size:
            np.copyto(acc, a.src)
        reduce = reducer(a.op, a.src.dtype)
        dist = 1
        while dist < n:
            digit = (vrank // dist) % radix
            if digit:
                yield (ch.isend(as_wire(acc), (vrank - digit * dist + root) % n, dist),)
                return
            children = [vrank + j * dist for j in range(1, radix) if vrank + j * dist < n]
            if children:
                bufs = [self.scratch(i, a.src) for i in range(len(children))]
                yield tuple(ch.irecv(as_wire(buf), (c + root) % n, dist) for buf, c in zip(bufs, children))
                for buf in bufs:  # in child order, so every call gives bitwise the same result
                    reduce(acc, buf, acc)
            dist *= radix
        if a.op is ReduceOp.AVG:
            finish_avg(acc, n)


def build(args: CollArgs) -> Task:
    task = KnomialReduce(args, name=args.name)
    n, radix, vrank = args.size, radix_of(args), (args.rank - args.root) % args.size
    dist = 1
    while dist < n and not (vrank // dist) % radix and vrank + dist >= n:
        dist *= radix  # no child at this distance: the first move is further up
    task.sends_first = dist < n and bool((vrank // dist) % radix)
    return task
