"""Rabenseifner's reduce, for large messages: a ring reduce-scatter leaves the rank v places after
the root with the full reduction of block v (n near-equal blocks), then a binomial gather brings
the reduced blocks to the root (a rank forwards its whole subtree's blocks, one contiguous range).
Each rank sends about 2x the buffer and reduces about 1x, instead of log2(n) x for the tree.

Only the root's output is written (non-root ranks work in scratch); the root may be in place.
"""

from __future__ import annotations

from typing import Dict, Generator

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, block_bounds
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.patterns import subtree_span
from pycoll.ops import ReduceOp, copy_into, finish_avg, reducer
from pycoll.tasks.task import Task

NAME = "rs_gather"
COLLECTIVES = ("reduce",)
OPTIONS: Dict[str, Option] = {}


class RsGatherReduce(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, root, ch = a.size, a.rank, a.root, a.channel
        src = a.src
        count = src.size
        if n == 1 or (count == 0 and not a.marked):
            if rank == root and a.dst is not src and count:
                copy_into(a.dst, src)
            return
        v = (rank - root) % n
        bounds = block_bounds(count, n)
        span = min(subtree_span(v, n), n - v)
        base = bounds[v]
        # the gather buffer: the blocks of this rank's subtree, at their offsets less ``base``
        acc = a.dst if v == 0 else self.scratch(2, src[:bounds[v + span] - base])
        reduce = reducer(a.op, src.dtype)

        def own(b: int) -> np.ndarray:
            return src[bounds[b]:bounds[b + 1]]

        # ring reduce-scatter over vranks (steps 0..n-2): in step s, send the partial sum of block
        # v-s-1 right, receive block v-s-2 from the left and add this rank's part of it
        most = src[:bounds[1] - bounds[0]]
        bufs = (self.scratch(0, most), self.scratch(1, most))  # received / partial, alternating
        right, left = (v + 1 + root) % n, (v - 1 + root) % n
        send = own((v - 1) % n)
        for s in range(n - 1):
            b = (v - s - 2) % n
            recv = bufs[s % 2][:bounds[b + 1] - bounds[b]]
            yield (ch.isend(as_wire(send), right, s), ch.irecv(as_wire(recv), left, s))
            out = acc[bounds[v] - base:bounds[v + 1] - base] if s == n - 2 else recv
            reduce(recv, own(b), out)
            send = out
        # binomial gather of the reduced blocks (step n-1): children's subtrees, then to the parent
        step = n - 1
        m = subtree_span(v, n) >> 1
        reqs = []
        while m:
            c = v + m
            if c < n:
                part = acc[bounds[c] - base:bounds[min(c + m, n)] - base]
                reqs.append(ch.irecv(as_wire(part), (c + root) % n, step))
            m >>= 1
        if reqs:
            yield reqs
        if v:
            yield (ch.isend(as_wire(acc), (v - (v & -v) + root) % n, step),)
        elif a.op is ReduceOp.AVG:
            finish_avg(a.dst, n)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    task = RsGatherReduce(args, name=args.name)
    task.sends_first = True  # the ring's first step sends and receives on every rank
    return task
