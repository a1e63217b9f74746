"""Recursive-doubling allreduce (latency-optimal: log2(n) steps, each exchanging the whole buffer).

Any team size: with ``p`` the largest power of two <= n and ``rem = n - p``, the first ``2*rem``
ranks pair up before the doubling (even ranks hand their data to the odd neighbour and sit out),
and get the result back afterwards, as MPICH does (:func:`~pycoll.algorithms.patterns.fold`). The
peers of every step are worked out once per task; a task is reused for calls of the same shape, so
a call only exchanges and reduces.
"""

from __future__ import annotations

from typing import Dict, Generator, Optional

from pycoll.algorithms.base import GO, GO_SINK, CollArgs, StepTask, Waitable, as_wire, copy_in, finish
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.patterns import IDLE, PROXY, doubling_peers, fold
from pycoll.ops import ReduceOp, reducer
from pycoll.tasks.task import Task

NAME = "rd"
COLLECTIVES = ("allreduce",)
OPTIONS: Dict[str, Option] = {}


class RecursiveDoublingAllreduce(StepTask):
    """One rank's recursive-doubling allreduce, as a resumable state machine."""

    def __init__(self, args: CollArgs, name: str) -> None:
        super().__init__(args, name)
        place = fold(args.rank, args.size)
        self.role, self.steps, self.last_step = place.role, doubling_peers(place), place.last_step
        self.reduce = reducer(args.op, args.dst.dtype)
        self.avg = args.op is ReduceOp.AVG
        self._views: Optional[tuple] = None  # (src, dst, and wire views of them and the scratch)

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        ch, rank, src, dst = a.channel, a.rank, a.src, a.dst
        if a.size == 1 or (dst.size == 0 and not a.marked):
            copy_in(a)
            finish(a)
            return
        # The first reduction reads the input and writes the output, so out of place needs no copy.
        views = self._views
        if views is None or views[0] is not src or views[1] is not dst:
            if views is not None and views[4].dtype is dst.dtype and views[4].size == dst.size:
                scratch, scratch_wire = views[4], views[5]  # (the same scratch: its views kept)
            else:
                scratch = self.scratch(0, dst)
                scratch_wire = as_wire(scratch)
            self._views = (src, dst, as_wire(src), as_wire(dst), scratch, scratch_wire)
        _, _, cur_wire, wire, scratch, scratch_wire = self._views
        cur = src
        reduce = self.reduce
        if self.role == IDLE:  # hand the data to rank + 1, get the result back at the end
            yield (ch.isend(cur_wire, rank + 1, 0),)
            yield (ch.irecv(GO_SINK, rank + 1, 0), ch.irecv(wire, rank + 1, self.last_step))
        else:
            if self.role == PROXY:  # "go" first: it starts the idle neighbour under a credit limit
                yield (ch.isend(GO, rank - 1, 0), ch.irecv(scratch_wire, rank - 1, 0))
                reduce(cur, scratch, dst)
                cur, cur_wire = dst, wire
            for peer, step in self.steps:
                yield (ch.exchange(cur_wire, scratch_wire, peer, step),)
                reduce(cur, scratch, dst)
                cur, cur_wire = dst, wire
            if self.role == PROXY:
                yield (ch.isend(wire, rank - 1, self.last_step),)
        if self.avg:
            finish(a)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return RecursiveDoublingAllreduce(args, name=args.name)
