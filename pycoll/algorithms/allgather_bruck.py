"""Bruck allgather(v): ceil(log2 n) steps for any team size. Rank r works in a scratch buffer
holding the blocks of ranks r, r+1, ..., r+n-1 (mod n) back to back; in step k (``d = 2^k``) it
sends the first ``min(d, n-d)`` blocks it holds to rank r-d and receives as many from rank r+d,
which are its blocks d, d+1, ...; a final rotation puts every block where the layout says.

With the blocks back to back in rank order (allgather, allgatherv without gaps) the rotated buffer is
``dst`` itself read cyclically from rank r's block: no scratch and no copies, a range of blocks that
wraps past the last rank moving as two messages."""

from __future__ import annotations

from typing import Dict, Generator, List, Tuple

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, is_packed
from pycoll.algorithms.options import Option, options
from pycoll.ops import copy_into
from pycoll.tasks.task import Task

NAME = "bruck"
COLLECTIVES = ("allgather", "allgatherv")
OPTIONS: Dict[str, Option] = {}


def pieces(first: int, cnt: int, n: int) -> List[Tuple[int, int]]:
    """The blocks ``first, first+1, ..., first+cnt-1`` (mod n) as at most two ranges of ranks that
    do not wrap around: ``[(lo, hi), ...]``."""
    if first + cnt <= n:
        return [(first, first + cnt)]
    return [(first, n), (0, first + cnt - n)]


class BruckAllgather(StepTask):
    def __init__(self, args: CollArgs, name: str) -> None:
        super().__init__(args, name)
        n, rank = args.size, args.rank
        self.packed = is_packed(args.layout)
        # offsets of the blocks in the rotated order: position j holds rank (rank + j) % n
        rot = [0]
        for j in range(n):
            rot.append(rot[-1] + args.layout[(rank + j) % n][1])
        self.rot = rot
        offs = [0]
        for _, cnt in args.layout:
            offs.append(offs[-1] + cnt)
        self.offs = offs

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch, rot = a.size, a.rank, a.channel, self.rot
        span = rot[-1]
        if span == 0:
            return
        if self.packed:
            yield from self._direct()
            return
        work = self.scratch(0, a.dst[:span])  # dst holds the n disjoint blocks: room for span
        copy_into(work[:rot[1]], a.src)
        wire = as_wire(work)
        isz = work.itemsize
        dist, step = 1, 0
        while dist < n:
            cnt = min(dist, n - dist)
            yield (ch.isend(wire[:rot[cnt] * isz], (rank - dist) % n, step),
                   ch.irecv(wire[rot[dist] * isz:rot[dist + cnt] * isz], (rank + dist) % n, step))
            dist *= 2
            step += 1
        for j in range(n):
            off, cnt = a.layout[(rank + j) % n]
            if cnt:
                copy_into(a.dst[off:off + cnt], work[rot[j]:rot[j + 1]])

    def _direct(self) -> Generator[Waitable, None, None]:
        """Packed blocks: the rotated buffer is dst itself, read cyclically from this rank's block,
        so a range of blocks that wraps past the last rank moves as two messages."""
        a = self.args
        n, rank, ch, offs = a.size, a.rank, a.channel, self.offs
        mine = a.dst[offs[rank]:offs[rank + 1]]
        if a.src.size and not np.may_share_memory(a.src, mine):  # in place: src is that block
            copy_into(mine, a.src)
        wire = as_wire(a.dst)
        isz = a.dst.itemsize
        dist, step = 1, 0
        while dist < n:
            cnt = min(dist, n - dist)
            to, frm = (rank - dist) % n, (rank + dist) % n
            reqs = [ch.isend(wire[offs[lo] * isz:offs[hi] * isz], to, 2 * step + i)
                    for i, (lo, hi) in enumerate(pieces(rank, cnt, n))]
            reqs += [ch.irecv(wire[offs[lo] * isz:offs[hi] * isz], frm, 2 * step + i)
                     for i, (lo, hi) in enumerate(pieces(frm, cnt, n))]
            yield reqs
            dist *= 2
            step += 1


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return BruckAllgather(args, name=args.name)
