"""Recursive-doubling scan and exscan (prefix reductions; MPICH's algorithm): ceil(log2(n)) steps.

At step k each rank exchanges with ``rank ^ 2**k`` (when that rank exists) the reduction of its
current group of ranks (``partial``, 2**k of them, aligned). Data from a lower rank is part of this
rank's prefix: it joins the output and the partial, lower ranks' data first; data from a higher
rank joins the partial only. The scan starts from this rank's own input (its output includes it);
the exscan's output starts empty and takes the first lower group whole (rank 0's output is left
as it was: MPI leaves it undefined). Reductions are in rank order, as MPI's are.
"""

from __future__ import annotations

from typing import Dict, Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.algorithms.options import Option, options
from pycoll.ops import copy_into, reducer
from pycoll.tasks.task import Task

NAME = "rd"
COLLECTIVES = ("scan", "exscan")
OPTIONS: Dict[str, Option] = {}


class RecursiveDoublingScan(StepTask):
    """One rank's recursive-doubling scan (``exclusive``: exscan), as a resumable state machine."""

    def __init__(self, args: CollArgs, name: str) -> None:
        super().__init__(args, name)
        self.exclusive = args.coll == "exscan"
        self.reduce = reducer(args.op, args.dst.dtype)
        self.peers = []  # (peer, step) of each step, worked out once
        mask, step = 1, 0
        while mask < args.size:
            if args.rank ^ mask < args.size:
                self.peers.append((args.rank ^ mask, step))
            mask <<= 1
            step += 1

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        ch, rank, src, dst = a.channel, a.rank, a.src, a.dst
        if (dst.size == 0 and not a.marked) or (a.size == 1 and self.exclusive):
            return
        partial = self.scratch(0, dst)  # this rank's group's reduction (what it sends)
        copy_into(partial, src)  # (before dst changes: in place, src is dst)
        if not self.exclusive:
            if dst is not src:
                copy_into(dst, src)
        incoming = self.scratch(1, dst)
        send, recv = as_wire(partial), as_wire(incoming)
        reduce = self.reduce
        has_output = not self.exclusive  # (an exscan's output starts empty)
        for peer, step in self.peers:
            yield (ch.exchange(send, recv, peer, step),)
            if peer < rank:  # lower ranks' data comes first
                if has_output:
                    reduce(incoming, dst, dst)
                else:
                    copy_into(dst, incoming)
                    has_output = True
                reduce(incoming, partial, partial)
            else:
                reduce(partial, incoming, partial)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return RecursiveDoublingScan(args, name=args.name)
