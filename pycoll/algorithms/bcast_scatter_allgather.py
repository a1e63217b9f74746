"""Scatter-allgather broadcast (van de Geijn), for large messages: the root's buffer is cut in n
near-equal blocks (block v belongs to the rank v places after the root), scattered down a
binomial tree (a rank receives its whole subtree's blocks, one contiguous range:
:func:`~pycoll.algorithms.patterns.subtree_span`), then circulated by a ring allgather. Each rank
moves about 2x the buffer instead of log2(n) x.

In the ring a block is sent only to a neighbour that lacks it: the root has every block, and
a rank already holds its subtree's blocks from the scatter, so those hops carry nothing.
"""

from __future__ import annotations

from typing import Dict, Generator, List

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, block_bounds
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.patterns import subtree_span
from pycoll.tasks.task import Task

NAME = "scatter_allgather"
COLLECTIVES = ("bcast",)
OPTIONS: Dict[str, Option] = {}


class ScatterAllgatherBcast(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, root, ch = a.size, a.rank, a.root, a.channel
        if n == 1 or (a.dst.size == 0 and not a.marked):
            return
        wire = as_wire(a.dst)
        bounds = block_bounds(wire.size, n)
        v = (rank - root) % n

        def span_of(u: int) -> int:  # the range of blocks [u, u + span) that u holds after the scatter
            return min(subtree_span(u, n), n - u)

        def blocks(lo: int, hi: int):
            return wire[bounds[lo]:bounds[hi]]

        # binomial scatter (step 0): receive the subtree's blocks, pass the children theirs
        span = span_of(v)
        if v:
            parent = v - (v & -v)
            yield (ch.irecv(blocks(v, v + span), (parent + root) % n, 0),)
        pending: List = []
        m = subtree_span(v, n) >> 1
        while m:
            c = v + m
            if c < n:  # farthest (largest) subtree first
                pending.append(ch.isend(blocks(c, min(c + m, n)), (c + root) % n, 0))
            m >>= 1
        # ring allgather (steps 1..n-1): in step s, block v - s goes right, v - s - 1 comes from the left
        right, left = (v + 1) % n, (v - 1) % n
        right_lo, right_hi = (0, n) if right == 0 else (right, right + span_of(right))
        mine_lo, mine_hi = (0, n) if v == 0 else (v, v + span)
        for s in range(n - 1):
            reqs = []
            b = (v - s) % n
            if not right_lo <= b < right_hi and bounds[b + 1] > bounds[b]:
                reqs.append(ch.isend(blocks(b, b + 1), (right + root) % n, 1 + s))
            b = (v - s - 1) % n
            if not mine_lo <= b < mine_hi and bounds[b + 1] > bounds[b]:
                reqs.append(ch.irecv(blocks(b, b + 1), (left + root) % n, 1 + s))
            if reqs:
                yield reqs
        if pending:
            yield pending


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    task = ScatterAllgatherBcast(args, name=args.name)
    # every rank but the root starts by receiving its blocks from its parent
    task.sends_first = args.rank == args.root or args.size == 1 or (args.dst.size == 0 and not args.marked)
    return task
