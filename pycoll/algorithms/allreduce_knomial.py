"""K-nomial allreduce ("recursive k-ing", k = option ``radix``, 4 by default): log_k(n) steps; in
each, a rank exchanges its buffer with the k-1 other members of its group and reduces all k in
group order (so every member gets bitwise the same result). Ranks beyond the largest power of k
first hand their data to a proxy among the first k^m ranks and get the result back at the end, as
UCC's knomial allreduce does.
"""

from __future__ import annotations

from typing import Dict, Generator, List, Optional, Tuple

import numpy as np

from pycoll.algorithms.base import (
    GO,
    GO_SINK,
    CollArgs,
    StepTask,
    Waitable,
    as_wire,
    copy_in,
    finish,
    reduce_ordered,
)
from pycoll.algorithms.options import Option, options
from pycoll.ops import reduce_into
from pycoll.tasks.task import Task

NAME = "knomial"
COLLECTIVES = ("allreduce",)
DEFAULT_RADIX = 4
OPTIONS: Dict[str, Option] = {
    "radix": Option(DEFAULT_RADIX, "ranks per group (k): log_k(n) steps of k-1 exchanges each", minimum=2),
}
#: Step id of the result handed back to the extra ranks.
FINAL = 1 + 64


class KnomialAllreduce(StepTask):
    """One rank's k-nomial allreduce, as a resumable state machine. Its groups are worked out
    once per task (a task is reused for calls of the same shape)."""

    def __init__(self, args: CollArgs, radix: int, name: str) -> None:
        super().__init__(args, name)
        n, rank = args.size, args.rank
        #: an extra rank's proxy (None on the others), a proxy's extra ranks
        self.proxy: Optional[int] = None
        self.extras: List[int] = []
        #: per step: (step id, this rank's digit, the other members of its group in group order)
        self.groups: List[Tuple[int, int, List[int]]] = []
        self.radix = radix = min(radix, n)
        if n == 1:
            return
        full = 1
        while full * radix <= n:
            full *= radix
        if rank >= full:  # an extra rank: its proxy works for it
            self.proxy = (rank - full) % full
            return
        self.extras = list(range(full + rank, n, full))
        dist, step = 1, 1
        while dist < full:
            digit = (rank // dist) % radix
            base = rank - digit * dist
            self.groups.append((step, digit, [base + i * dist for i in range(radix) if i != digit]))
            dist *= radix
            step += 1

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        ch, op, radix = a.channel, a.op, self.radix
        copy_in(a)
        dst = a.dst
        if a.size == 1 or (dst.size == 0 and not a.marked):
            finish(a)
            return
        wire = as_wire(dst)
        proxy = self.proxy
        if proxy is not None:
            yield (ch.isend(wire, proxy, 0),)
            yield (ch.irecv(GO_SINK, proxy, 0), ch.irecv(wire, proxy, FINAL))
            finish(a)
            return
        extras = self.extras
        if extras:
            bufs = [self.scratch(radix + i, dst) for i in range(len(extras))]
            # "go" first: it starts the extra ranks under a credit limit
            yield (*(ch.isend(GO, e, 0) for e in extras),
                   *(ch.irecv(as_wire(b), e, 0) for e, b in zip(extras, bufs)))
            for b in bufs:
                reduce_into(dst, b, op)
        scratch: List[np.ndarray] = [self.scratch(i, dst) for i in range(radix - 1)]
        for step, digit, peers in self.groups:
            reqs = [ch.isend(wire, p, step) for p in peers]
            reqs += [ch.irecv(as_wire(buf), p, step) for p, buf in zip(peers, scratch)]
            yield reqs
            parts = scratch[:digit] + [dst] + scratch[digit:]
            reduce_ordered(dst, parts, op)
        if extras:
            yield tuple(ch.isend(wire, e, FINAL) for e in extras)
        finish(a)


def build(args: CollArgs) -> Task:
    opts = options(args, OPTIONS)
    return KnomialAllreduce(args, opts["radix"], args.name)  # every rank sends first (proxies their "go")
