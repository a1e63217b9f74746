"""Recursive-doubling allgather(v): log2(n) exchanges, in step k each rank swaps the 2^k blocks it
holds with the rank whose (folded) number differs in bit k, so the blocks held double each step.

Any team size, as allreduce_rd does: with ``p`` the largest power of two <= n and ``rem = n - p``,
the even ranks among the first ``2*rem`` hand their block to the odd neighbour (step 0) and sit out;
the ``p`` remaining ranks double, new rank ``i`` standing for ranks ``[lo(i), lo(i+1))`` with
``lo(i) = i + min(i, rem)`` (two ranks for ``i < rem``), so a range of new ranks is a range of
ranks; at the end the odd ranks send the whole result to their even neighbour
(:func:`~pycoll.algorithms.patterns.fold`).

The exchanges work on the blocks packed back to back in rank order: ``dst`` itself when the layout
is packed (a range of ranks is one slice, one message), else a scratch buffer copied out at the end.
"""

from __future__ import annotations

from typing import Dict, Generator

import numpy as np

from pycoll.algorithms.base import GO, GO_SINK, CollArgs, StepTask, Waitable, as_wire, is_packed
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.patterns import IDLE, PROXY, doubling_peers, fold
from pycoll.ops import copy_into
from pycoll.tasks.task import Task

NAME = "rd"
COLLECTIVES = ("allgather", "allgatherv")
OPTIONS: Dict[str, Option] = {}


class RecursiveDoublingAllgather(StepTask):
    def __init__(self, args: CollArgs, name: str) -> None:
        super().__init__(args, name)
        place = fold(args.rank, args.size)
        self.role, self.last_step = place.role, place.last_step
        self.packed = is_packed(args.layout)
        # offsets of each rank's block in the packed order (n + 1 entries)
        offs = [0]
        for _, cnt in args.layout:
            offs.append(offs[-1] + cnt)
        self.offs = offs
        # the doubling: (peer rank, step, ranks whose blocks go, ranks whose blocks come); in step k
        # a new rank holds the blocks of the 2^(k-1) new ranks that share its bits above k-1
        me, first = place.newrank, place.first_rank
        self.steps = []
        for to, step in doubling_peers(place):
            mask = 1 << (step - 1)
            base, pbase = me & ~(mask - 1), (me ^ mask) & ~(mask - 1)
            self.steps.append((to, step, (first(base), first(base + mask)),
                               (first(pbase), first(pbase + mask))))

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch, offs = a.size, a.rank, a.channel, self.offs
        span = offs[-1]
        # dst holds the n disjoint blocks, so it has room for span elements
        work = a.dst[:span] if self.packed else self.scratch(0, a.dst[:span])
        mine = work[offs[rank]:offs[rank + 1]]
        if a.src.size and not np.may_share_memory(a.src, mine):  # in place: src is that block
            copy_into(mine, a.src)
        if n > 1 and span:
            wire = as_wire(work)
            isz = work.itemsize

            def rng(first: int, last: int) -> np.ndarray:  # the blocks of ranks [first, last)
                return wire[offs[first] * isz:offs[last] * isz]

            last_step = self.last_step  # steps 1 .. log2(p) double; this one hands back
            if self.role == IDLE:
                yield (ch.isend(as_wire(mine), rank + 1, 0),)
                yield (ch.irecv(GO_SINK, rank + 1, 0), ch.irecv(wire, rank + 1, last_step))
            else:
                if self.role == PROXY:  # "go" first: it starts the idle neighbour under a credit limit
                    yield (ch.isend(GO, rank - 1, 0), ch.irecv(rng(rank - 1, rank), rank - 1, 0))
                for to, step, (s_lo, s_hi), (r_lo, r_hi) in self.steps:
                    yield (ch.isend(rng(s_lo, s_hi), to, step), ch.irecv(rng(r_lo, r_hi), to, step))
                if self.role == PROXY:
                    yield (ch.isend(wire, rank - 1, last_step),)
        if not self.packed:
            for r, (off, cnt) in enumerate(a.layout):
                if cnt:
                    copy_into(a.dst[off:off + cnt], work[offs[r]:offs[r + 1]])


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return RecursiveDoublingAllgather(args, name=args.name)
