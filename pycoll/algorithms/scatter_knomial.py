"""K-nomial tree scatter(v) (binomial for radix 2, the default; option ``radix``): log_k(n) rounds
instead of the linear scatter's n-1 messages out of the root. The root sends each child its whole
subtree's blocks as one message packed in subtree order (the ranks 0, 1, ... places after the
root; straight from its input when those blocks lie back to back there), farthest subtree first;
an inner rank keeps its own block and passes its children theirs. The tree: the gather's
(:class:`~pycoll.algorithms.gather_knomial.TreePlan`).

The v-form needs ``counts`` on every rank (an inner rank must know its subtree's sizes).
"""

from __future__ import annotations

from typing import Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.algorithms.gather_knomial import TreePlan
from pycoll.algorithms.options import TREE_OPTIONS, options
from pycoll.ops import copy_into
from pycoll.tasks.task import Task

NAME = "knomial"
COLLECTIVES = ("scatter", "scatterv")
OPTIONS = TREE_OPTIONS


class KnomialScatter(StepTask):
    def __init__(self, args: CollArgs, radix: int, name: str) -> None:
        super().__init__(args, name)
        self.plan = TreePlan(args, radix)
        # the root sends first; every other rank waits for its parent
        self.sends_first = self.plan.parent is None

    def run(self) -> Generator[Waitable, None, None]:
        a, p = self.args, self.plan
        ch = a.channel
        if p.parent is not None:
            if p.leaf:
                yield (ch.irecv(as_wire(a.dst), p.parent, 0),)
                return
            buf = self.scratch_of(0, p.scratch_size, a.dst.dtype)
            yield (ch.irecv(as_wire(buf), p.parent, 0),)
            sends = tuple(ch.isend(as_wire(buf[lo:hi]), r, 0) for r, lo, hi, _, _ in p.children)
            own = a.dst.size
            if own:
                copy_into(a.dst, buf[:own])
            yield sends
            return
        # the root: pack the children's subtrees that are not back to back in the input, send
        buf = self.scratch_of(0, p.scratch_size, a.src.dtype) if p.scratch_size else a.src[:0]
        sends = []
        for r, lo, hi, span, pieces in p.children:
            if span is None:
                for at, off, cnt in pieces:
                    if cnt:
                        copy_into(buf[lo + at:lo + at + cnt], a.src[off:off + cnt])
                part = buf[lo:hi]
            else:
                part = a.src[span[0]:span[1]]
            sends.append(ch.isend(as_wire(part), r, 0))
        off, cnt = a.layout[a.rank]
        if cnt:
            copy_into(a.dst, a.src[off:off + cnt])
        if sends:
            yield sends


def build(args: CollArgs) -> Task:
    opts = options(args, OPTIONS)
    return KnomialScatter(args, opts["radix"], args.name)
