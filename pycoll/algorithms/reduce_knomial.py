"""K-nomial tree reduce to a root (binomial for radix 2, the default; option ``radix``): at
distance d = radix^k a rank whose k-th base-radix digit (relative to the root) is non-zero sends
its partial result to the rank digit * d below and is done; the others receive from their children
vrank + j * d (j = 1..radix-1) and combine them in increasing order. log_radix(n) rounds; only the
root's output is written. The tree: :func:`~pycoll.algorithms.patterns.knomial_parent`."""

from __future__ import annotations

from typing import Generator, List, Optional, Tuple

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.algorithms.options import TREE_OPTIONS, options
from pycoll.algorithms.patterns import knomial_levels, knomial_parent
from pycoll.ops import ReduceOp, copy_into, finish_avg, reducer
from pycoll.tasks.task import Task

NAME = "knomial"
COLLECTIVES = ("reduce",)
OPTIONS = TREE_OPTIONS


class KnomialReduce(StepTask):
    """One rank's part of the tree, worked out once per task (a task is reused for calls of the
    same shape)."""

    def __init__(self, args: CollArgs, radix: int, name: str) -> None:
        super().__init__(args, name)
        n, root = args.size, args.root
        v = (args.rank - root) % n
        parent, dist = knomial_parent(v, n, radix)
        self.radix = radix
        #: per level that has children, nearest first: (step id: the distance, child ranks in order)
        self.levels: List[Tuple[int, List[int]]] = [
            (d, [(c + root) % n for c in kids]) for d, kids in knomial_levels(v, n, radix, dist) if kids]
        #: (parent rank, step id) or None at the root
        self.to_parent: Optional[Tuple[int, int]] = None if parent is None else ((parent + root) % n, dist)
        # a leaf sends first; an inner rank or the root waits for its children
        self.sends_first = parent is not None and not self.levels

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        ch = a.channel
        acc = a.dst if a.rank == a.root else self.scratch(self.radix, a.src)
        if acc is not a.src and a.src.size:
            copy_into(acc, a.src)
        reduce = reducer(a.op, a.src.dtype)
        for step, children in self.levels:
            bufs = [self.scratch(i, a.src) for i in range(len(children))]
            yield tuple(ch.irecv(as_wire(buf), c, step) for buf, c in zip(bufs, children))
            for buf in bufs:  # in child order, so every call gives bitwise the same result
                reduce(acc, buf, acc)
        if self.to_parent is not None:
            yield (ch.isend(as_wire(acc), *self.to_parent),)
        elif a.op is ReduceOp.AVG:
            finish_avg(acc, a.size)


def build(args: CollArgs) -> Task:
    opts = options(args, OPTIONS)
    return KnomialReduce(args, opts["radix"], args.name)
