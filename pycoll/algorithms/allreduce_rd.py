"""Recursive-doubling allreduce (latency-optimal: log2(n) steps, each exchanging the whole buffer).

Any team size: with ``p`` the largest power of two <= n and ``rem = n - p``, the first ``2*rem``
ranks pair up before the doubling (even ranks hand their data to the odd neighbour and sit out),
and get the result back afterwards, as MPICH does. The peers of every step are worked out once
per task; a task is reused for calls of the same shape, so a call only exchanges and reduces.
"""

from __future__ import annotations

from typing import Generator, List, Optional, Tuple

from pycoll.algorithms.base import GO, GO_SINK, CollArgs, StepTask, Waitable, as_wire, copy_in, finish
from pycoll.ops import ReduceOp, reducer
from pycoll.tasks.task import Task


def plan(rank: int, n: int) -> Tuple[str, List[Tuple[int, int]], int]:
    """``(role, [(peer, step), ...], last_step)`` of ``rank`` in a team of ``n``: role ``"idle"``
    for even ranks of the pre-step, ``"proxy"`` for their odd partners, ``"plain"`` otherwise."""
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    last_step = p.bit_length()  # steps 1 .. log2(p) double; this one returns the result
    if rank < 2 * rem and rank % 2 == 0:
        return "idle", [], last_step
    role = "proxy" if rank < 2 * rem else "plain"
    newrank = rank // 2 if role == "proxy" else rank - rem
    steps, mask, step = [], 1, 1
    while mask < p:
        newpeer = newrank ^ mask
        steps.append((newpeer * 2 + 1 if newpeer < rem else newpeer + rem, step))
        mask <<= 1
        step += 1
    return role, steps, last_step


class RecursiveDoublingAllreduce(StepTask):
    """One rank's recursive-doubling allreduce, as a resumable state machine."""

    def __init__(self, args: CollArgs, name: str) -> None:
        super().__init__(args, name)
        self.role, self.steps, self.last_step = plan(args.rank, args.size)
        self.reduce = reducer(args.op, args.dst.dtype)
        self.avg = args.op is ReduceOp.AVG
        self._views: Optional[tuple] = None  # (src, dst, and wire views of them and the scratch)

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        ch, rank, src, dst = a.channel, a.rank, a.src, a.dst
        if a.size == 1 or dst.size == 0:
            copy_in(a)
            finish(a)
            return
        # The first reduction reads the input and writes the output, so out of place needs no copy.
        if self._views is None or self._views[0] is not src or self._views[1] is not dst:
            scratch = self.scratch(0, dst)
            self._views = (src, dst, as_wire(src), as_wire(dst), scratch, as_wire(scratch))
        _, _, cur_wire, wire, scratch, scratch_wire = self._views
        cur = src
        reduce = self.reduce
        if self.role == "idle":  # hand the data to rank + 1, get the result back at the end
            yield (ch.isend(cur_wire, rank + 1, 0),)
            yield (ch.irecv(GO_SINK, rank + 1, 0), ch.irecv(wire, rank + 1, self.last_step))
        else:
            if self.role == "proxy":  # "go" first: it starts the idle neighbour under a credit limit
                yield (ch.isend(GO, rank - 1, 0), ch.irecv(scratch_wire, rank - 1, 0))
                reduce(cur, scratch, dst)
                cur, cur_wire = dst, wire
            for peer, step in self.steps:
                yield (ch.exchange(cur_wire, scratch_wire, peer, step),)
                reduce(cur, scratch, dst)
                cur, cur_wire = dst, wire
            if self.role == "proxy":
                yield (ch.isend(wire, rank - 1, self.last_step),)
        if self.avg:
            finish(a)


def build(args: CollArgs) -> Task:
    return RecursiveDoublingAllreduce(args, name=args.name)
