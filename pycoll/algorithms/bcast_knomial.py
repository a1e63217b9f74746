"""K-nomial tree broadcast (binomial for radix 2, the default; option ``radix``): log_k(n) rounds;
a rank receives the buffer from its parent, then sends it to its children, farthest subtree first
(:func:`~pycoll.algorithms.patterns.knomial_parent`)."""

from __future__ import annotations

from typing import Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.algorithms.options import TREE_OPTIONS, options
from pycoll.algorithms.patterns import knomial_levels, knomial_parent
from pycoll.tasks.task import Task

NAME = "knomial"
COLLECTIVES = ("bcast",)
OPTIONS = TREE_OPTIONS


class KnomialBcast(StepTask):
    """One rank's part of the tree, worked out once per task (a task is reused for calls of the
    same shape)."""

    def __init__(self, args: CollArgs, radix: int, name: str) -> None:
        super().__init__(args, name)
        n, root = args.size, args.root
        v = (args.rank - root) % n
        parent, dist = knomial_parent(v, n, radix)
        self.parent_rank = None if parent is None else (parent + root) % n
        # farthest level first; within a level, nearest child first
        levels = knomial_levels(v, n, radix, dist)
        self.child_ranks = [(c + root) % n for _, kids in reversed(levels) for c in kids]
        self.sends_first = args.rank == root

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        if a.size == 1 or (a.dst.size == 0 and not a.marked):
            return
        ch = a.channel
        wire = as_wire(a.dst)
        if self.parent_rank is not None:
            yield (ch.irecv(wire, self.parent_rank, 0),)
        if self.child_ranks:
            yield [ch.isend(wire, c, 0) for c in self.child_ranks]


def build(args: CollArgs) -> Task:
    opts = options(args, OPTIONS)
    return KnomialBcast(args, opts["radix"], args.name)
