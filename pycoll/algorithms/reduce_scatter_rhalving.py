"""Recursive-halving reduce-scatter(v): log2(n) steps; in each a rank sends the half of its range of
blocks that its partner keeps, receives the partner's partial sums of the half it keeps and adds
them in, so the range halves every step until it is the rank's own block.

Any team size, as MPICH does: with ``p`` the largest power of two <= n and ``rem = n - p``, the even
ranks among the first ``2*rem`` send their whole input to the odd neighbour, which adds it in
(step 0) and stands for both; new rank ``i`` owns the blocks of ranks ``[lo(i), lo(i+1))`` with
``lo(i) = i + min(i, rem)`` (:func:`~pycoll.algorithms.patterns.fold`); at the end the odd ranks
send the even neighbour its block. Every block is reduced in the same order on every call (results
are reproducible); AVG divides at the end.
"""

from __future__ import annotations

from typing import Dict, Generator, List, Tuple

from pycoll.algorithms.base import GO, GO_SINK, CollArgs, StepTask, Waitable, as_wire, is_packed
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.patterns import IDLE, PLAIN, PROXY, fold
from pycoll.ops import ReduceOp, copy_into, finish_avg, reducer
from pycoll.tasks.task import Task

NAME = "rhalving"
COLLECTIVES = ("reduce_scatter", "reduce_scatterv")
OPTIONS: Dict[str, Option] = {}


class RecursiveHalvingReduceScatter(StepTask):
    def __init__(self, args: CollArgs, name: str) -> None:
        super().__init__(args, name)
        n = args.size
        place = fold(args.rank, n)
        self.role, self.newrank, self.p = place.role, place.newrank, place.p
        lo = [place.first_rank(i) for i in range(place.p + 1)]  # the first rank of each new rank
        self.packed = is_packed(args.layout)
        offs = [0]
        for _, cnt in args.layout:
            offs.append(offs[-1] + cnt)
        self.offs = offs
        # the halving steps: (peer rank, step, element range sent, element range kept)
        steps: List[Tuple[int, int, Tuple[int, int], Tuple[int, int]]] = []
        me, mask, step = self.newrank, self.p >> 1, 1
        need = offs[-1] if self.role == PROXY else 0  # the largest receive
        while mask >= 1 and self.role != IDLE:
            peer = me ^ mask
            base = me & ~(2 * mask - 1)  # my range of new ranks is [base, base + 2*mask)
            lower = (offs[lo[base]], offs[lo[base + mask]])
            upper = (offs[lo[base + mask]], offs[lo[base + 2 * mask]])
            send, keep = (upper, lower) if me < peer else (lower, upper)
            steps.append((place.rank_of(peer), step, send, keep))
            need = max(need, keep[1] - keep[0])
            mask >>= 1
            step += 1
        self.steps = steps
        self.need = need
        self.last_step = place.last_step  # steps 1 .. log2(p) halve; this one hands back

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch, offs = a.size, a.rank, a.channel, self.offs
        span = offs[-1]
        src = a.src[:span]
        if not self.packed:  # blocks back to back in rank order (reduce_scatterv's always are)
            src = self.scratch(2, a.src[:span])
            for r, (off, cnt) in enumerate(a.layout):
                copy_into(src[offs[r]:offs[r + 1]], a.src[off:off + cnt])
        if n == 1 or span == 0:
            if a.dst.size:
                copy_into(a.dst, src[offs[rank]:offs[rank + 1]])
        elif self.role == IDLE:  # hand the input to rank + 1, get the block back at the end
            yield (ch.isend(as_wire(src), rank + 1, 0),)
            yield (ch.irecv(GO_SINK, rank + 1, 0), ch.irecv(as_wire(a.dst), rank + 1, self.last_step))
        else:
            reduce = reducer(a.op, a.dst.dtype)
            acc = self.scratch(0, a.src[:span])  # the partial sums of the range still held
            recv = self.scratch(1, a.src[:self.need])
            cur = src  # the first reduction reads the input: no copy
            if self.role == PROXY:  # "go" first: it starts the idle neighbour under a credit limit
                yield (ch.isend(GO, rank - 1, 0), ch.irecv(as_wire(recv[:span]), rank - 1, 0))
                reduce(recv[:span], cur, acc)  # rank - 1 first: reduced in rank order
                cur = acc
            last = len(self.steps) - 1
            for i, (peer, step, (slo, shi), (klo, khi)) in enumerate(self.steps):
                got = recv[:khi - klo]
                yield (ch.isend(as_wire(cur[slo:shi]), peer, step), ch.irecv(as_wire(got), peer, step))
                out = a.dst if i == last and self.role == PLAIN else acc[klo:khi]
                reduce(cur[klo:khi], got, out)
                cur = acc
            if self.role == PROXY:  # acc holds the blocks of rank - 1 and rank
                yield (ch.isend(as_wire(acc[offs[rank - 1]:offs[rank]]), rank - 1, self.last_step),)
                if a.dst.size:
                    copy_into(a.dst, acc[offs[rank]:offs[rank + 1]])
        if a.op is ReduceOp.AVG:
            finish_avg(a.dst, n)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return RecursiveHalvingReduceScatter(args, name=args.name)
