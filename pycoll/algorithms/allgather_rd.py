"""Recursive-doubling allgather(v): log2(n) exchanges, in step k each rank swaps the 2^k blocks it
holds with the rank whose (folded) number differs in bit k, so the blocks held double each step.

Any team size, as allreduce_rd does: with ``p`` the largest power of two <= n and ``rem = n - p``,
the even ranks among the first ``2*rem`` hand their block to the odd neighbour (step 0) and sit out;
the ``p`` remaining ranks double, new rank ``i`` standing for ranks ``[lo(i), lo(i+1))`` with
``lo(i) = i + min(i, rem)`` (two ranks for ``i < rem``), so a range of new ranks is a range of
ranks; at the end the odd ranks send the whole result to their even neighbour.

The exchanges work on the blocks packed back to back in rank order: ``dst`` itself when the layout
is packed (a range of ranks is one slice, one message), else a scratch buffer copied out at the end.
"""

from __future__ import annotations

from typing import Generator, List, Tuple

import numpy as np

from pycoll.algorithms.base import GO, GO_SINK, CollArgs, StepTask, Waitable, as_wire, is_packed
from pycoll.tasks.task import Task


def fold(rank: int, n: int) -> Tuple[str, int, int, List[int]]:
    """``(role, newrank, p, lo)`` of ``rank`` in a team of ``n``: role ``"idle"`` (hands its block
    to rank + 1), ``"proxy"`` (stands for rank - 1 and itself) or ``"plain"``; ``lo[i]`` is the
    first rank new rank ``i`` stands for (``p + 1`` entries)."""
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    lo = [i + min(i, rem) for i in range(p + 1)]
    if rank < 2 * rem:
        return ("idle" if rank % 2 == 0 else "proxy"), rank // 2, p, lo
    return "plain", rank - rem, p, lo


class RecursiveDoublingAllgather(StepTask):
    def __init__(self, args: CollArgs, name: str) -> None:
        super().__init__(args, name)
        self.role, self.newrank, self.p, self.lo = fold(args.rank, args.size)
        self.packed = is_packed(args.layout)
        # offsets of each rank's block in the packed order (n + 1 entries)
        offs = [0]
        for _, cnt in args.layout:
            offs.append(offs[-1] + cnt)
        self.offs = offs

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch, offs, lo = a.size, a.rank, a.channel, self.offs, self.lo
        span = offs[-1]
        # dst holds the n disjoint blocks, so it has room for span elements
        work = a.dst[:span] if self.packed else self.scratch(0, a.dst[:span])
        mine = work[offs[rank]:offs[rank + 1]]
        if a.src.size and not np.may_share_memory(a.src, mine):  # in place: src is that block
            np.copyto(mine, a.src)
        if n > 1 and span:
            wire = as_wire(work)
            isz = work.itemsize

            def rng(first: int, last: int) -> np.ndarray:  # the blocks of ranks [first, last)
                return wire[offs[first] * isz:offs[last] * isz]

            last_step = self.p.bit_length()  # steps 1 .. log2(p) double; this one hands back
            if self.role == "idle":
                yield (ch.isend(as_wire(mine), rank + 1, 0),)
                yield (ch.irecv(GO_SINK, rank + 1, 0), ch.irecv(wire, rank + 1, last_step))
            else:
                if self.role == "proxy":  # "go" first: it starts the idle neighbour under a credit limit
                    yield (ch.isend(GO, rank - 1, 0), ch.irecv(rng(rank - 1, rank), rank - 1, 0))
                rem = n - self.p
                me, mask, step = self.newrank, 1, 1
                while mask < self.p:
                    peer = me ^ mask
                    base = me & ~(mask - 1)  # the new ranks whose blocks I hold
                    pbase = peer & ~(mask - 1)
                    to = peer * 2 + 1 if peer < rem else peer + rem
                    yield (ch.isend(rng(lo[base], lo[base + mask]), to, step),
                           ch.irecv(rng(lo[pbase], lo[pbase + mask]), to, step))
                    mask <<= 1
                    step += 1
                if self.role == "proxy":
                    yield (ch.isend(wire, rank - 1, last_step),)
        if not self.packed:
            for r, (off, cnt) in enumerate(a.layout):
                if cnt:
                    np.copyto(a.dst[off:off + cnt], work[offs[r]:offs[r + 1]])


def build(args: CollArgs) -> Task:
    return RecursiveDoublingAllgather(args, name=args.name)
