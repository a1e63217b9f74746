"""K-nomial tree gather(v) (binomial for radix 2, the default; option ``radix``): log_k(n) rounds
instead of the linear gather's n-1 messages into the root. A rank receives its children's
subtrees, each one message packed in subtree order (the ranks 0, 1, ... places after the root),
and sends its own subtree up as one message. The root receives a child's subtree straight into its
output when those blocks lie back to back there, else through scratch. The tree:
:func:`~pycoll.algorithms.patterns.knomial_tree`.

The v-form needs ``counts`` on every rank (an inner rank must know its subtree's sizes).
"""

from __future__ import annotations

from typing import Generator, Optional, Sequence, Tuple

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.algorithms.options import TREE_OPTIONS, options
from pycoll.algorithms.patterns import knomial_tree
from pycoll.ops import copy_into
from pycoll.tasks.task import Task

NAME = "knomial"
COLLECTIVES = ("gather", "gatherv")
OPTIONS = TREE_OPTIONS


def check_layout(args: CollArgs) -> Sequence[Tuple[int, int]]:
    if args.layout is None:
        raise ValueError(f"{args.coll} 'knomial' needs counts on every rank")
    return args.layout


def contiguous(layout: Sequence[Tuple[int, int]], ranks: Sequence[int]) -> Optional[Tuple[int, int]]:
    """``(lo, hi)`` when the blocks of ``ranks`` lie back to back, in this order, in the whole
    buffer (empty blocks anywhere), else None."""
    lo = hi = None
    for r in ranks:
        off, cnt = layout[r]
        if not cnt:
            continue
        if hi is None:
            lo = off
        elif off != hi:
            return None
        hi = off + cnt
    return (0, 0) if lo is None else (lo, hi)


class TreePlan:
    """What one rank does in a k-nomial gather or scatter (fixed for a call shape)."""

    def __init__(self, args: CollArgs, radix: int) -> None:
        n, root = args.size, args.root
        layout = check_layout(args)
        self.v = v = (args.rank - root) % n
        parent, children, end = knomial_tree(v, n, radix)
        self.parent = None if parent is None else (parent + root) % n
        #: packed offsets: vrank i's block at packed[i] - packed[v] of this rank's subtree buffer
        packed = [0]
        for i in range(v, end):
            packed.append(packed[-1] + layout[(i + root) % n][1])
        self.total = packed[-1]
        self.leaf = not children
        #: per child: (rank, lo, hi of its subtree's data in scratch, (lo, hi) in the whole buffer
        #: or None: through scratch, [(offset in its data, whole-buffer offset, count)] per block).
        #: An inner rank's scratch is its subtree packed (own block first); the root's holds only
        #: the children whose blocks are not back to back in the whole buffer.
        self.children = []
        self.scratch_size = 0 if parent is None else self.total
        for c, ce in children:
            ranks = [(i + root) % n for i in range(c, ce)]
            lo, hi = packed[c - v], packed[ce - v]
            span = contiguous(layout, ranks) if parent is None else None
            if parent is None and span is None:
                lo, hi = self.scratch_size, self.scratch_size + hi - lo
                self.scratch_size = hi
            pieces = [(packed[i - v] - packed[c - v], *layout[(i + root) % n]) for i in range(c, ce)]
            self.children.append(((c + root) % n, lo, hi, span, pieces))


class KnomialGather(StepTask):
    def __init__(self, args: CollArgs, radix: int, name: str) -> None:
        super().__init__(args, name)
        self.plan = TreePlan(args, radix)
        # a leaf sends its block first; an inner rank or the root waits for its children
        self.sends_first = self.plan.leaf and self.plan.parent is not None

    def run(self) -> Generator[Waitable, None, None]:
        a, p = self.args, self.plan
        ch = a.channel
        if p.parent is not None:
            if p.leaf:
                yield (ch.isend(as_wire(a.src), p.parent, 0),)
                return
            buf = self.scratch_of(0, p.scratch_size, a.src.dtype)
            own = a.src.size
            if own:
                copy_into(buf[:own], a.src)
            yield tuple(ch.irecv(as_wire(buf[lo:hi]), r, 0) for r, lo, hi, _, _ in p.children)
            yield (ch.isend(as_wire(buf), p.parent, 0),)
            return
        # the root: its own block, then every child's subtree into place
        off, cnt = a.layout[a.rank]
        if cnt:
            copy_into(a.dst[off:off + cnt], a.src)
        if p.leaf:
            return
        buf = self.scratch_of(0, p.scratch_size, a.dst.dtype) if p.scratch_size else a.dst[:0]
        reqs = []
        for r, lo, hi, span, _ in p.children:
            part = a.dst[span[0]:span[1]] if span is not None else buf[lo:hi]
            reqs.append(ch.irecv(as_wire(part), r, 0))
        yield reqs
        for _, lo, _, span, pieces in p.children:
            if span is None:
                for at, off, cnt in pieces:
                    if cnt:
                        copy_into(a.dst[off:off + cnt], buf[lo + at:lo + at + cnt])


def build(args: CollArgs) -> Task:
    opts = options(args, OPTIONS)
    return KnomialGather(args, opts["radix"], args.name)
