"""K-nomial allreduce ("recursive k-ing"): log_k(n) steps; in each, a rank exchanges its buffer
with the k-1 other members of its group and reduces all k in group order (so every member gets
bitwise the same result). Ranks beyond the largest power of k first hand their data to a proxy
among the first k^m ranks and get the result back at the end, as UCC's knomial allreduce does.
"""

from __future__ import annotations

from typing import Generator, List

import numpy as np  # noqa: F401 - for annotations

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
from pycoll.ops import reduce_into
from pycoll.tasks.task import Task

DEFAULT_RADIX = 4


class KnomialAllreduce(StepTask):
    """One rank's k-nomial allreduce, as a resumable state machine."""

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        ch, rank, n, op = a.channel, a.rank, a.size, a.op
        radix = int(a.options.get("radix", DEFAULT_RADIX))
        if radix < 2:
            raise ValueError(f"knomial radix must be >= 2, got {radix}")
        copy_in(a)
        dst = a.dst
        if n == 1 or dst.size == 0:
            finish(a)
            return
        radix = min(radix, n)
        full = 1
        while full * radix <= n:
            full *= radix
        wire = as_wire(dst)
        final = 1 + 64  # step id of the result handed back to extra ranks
        if rank >= full:  # an extra rank: its proxy works for it
            proxy = (rank - full) % full
            yield (ch.isend(wire, proxy, 0),)
            yield (ch.irecv(GO_SINK, proxy, 0), ch.irecv(wire, proxy, final))
            finish(a)
            return
        extras = list(range(full + rank, n, full))
        if extras:
            bufs = [self.scratch(radix + i, dst) for i in range(len(extras))]
            # "go" first: it starts the extra ranks under a credit limit
            yield (*(ch.isend(GO, e, 0) for e in extras),
                   *(ch.irecv(as_wire(b), e, 0) for e, b in zip(extras, bufs)))
            for b in bufs:
                reduce_into(dst, b, op)
        scratch: List[np.ndarray] = [self.scratch(i, dst) for i in range(radix - 1)]
        dist, step = 1, 1
        while dist < full:
            digit = (rank // dist) % radix
            base = rank - digit * dist
            peers = [base + i * dist for i in range(radix) if i != digit]
            reqs = [ch.isend(wire, p, step) for p in peers]
            reqs += [ch.irecv(as_wire(buf), p, step) for p, buf in zip(peers, scratch)]
            yield reqs
            parts = scratch[:digit] + [dst] + scratch[digit:]
            reduce_ordered(dst, parts, op)
            dist *= radix
            step += 1
        if extras:
            yield tuple(ch.isend(wire, e, final) for e in extras)
        finish(a)


def build(args: CollArgs) -> Task:
    return KnomialAllreduce(args, name=args.name)  # every rank sends first (proxies their "go")
