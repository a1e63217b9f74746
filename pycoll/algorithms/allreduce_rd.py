"""Recursive-doubling allreduce (latency-optimal: log2(n) steps, each exchanging the whole buffer).

Any team size: with ``p`` the largest power of two <= n and ``rem = n - p``, the first ``2*rem``
ranks pair up before the doubling (even ranks hand their data to the odd neighbour and sit out),
and get the result back afterwards, as MPICH does.
"""

from __future__ import annotations

from typing import Generator

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, copy_in, finish
from pycoll.ops import reducer
from pycoll.tasks.task import Task


class RecursiveDoublingAllreduce(StepTask):
    """One rank's recursive-doubling allreduce, as a resumable state machine."""

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        ch, rank, n, src, dst = a.channel, a.rank, a.size, a.src, a.dst
        if n == 1 or dst.size == 0:
            copy_in(a)
            finish(a)
            return
        # The first reduction reads the input and writes the output, so out of place needs no copy.
        cur, cur_wire, wire = src, as_wire(src), as_wire(dst)
        scratch = self.scratch(0, dst)
        scratch_wire = as_wire(scratch)
        reduce = reducer(a.op, dst.dtype)
        p = 1 << (n.bit_length() - 1)
        rem = n - p
        last_step = p.bit_length()  # steps 1 .. log2(p) double; this one returns the result
        if rank < 2 * rem:
            if rank % 2 == 0:  # hand the data to rank + 1, get the result back at the end
                yield (ch.isend(cur_wire, rank + 1, 0),)
                yield (ch.irecv(wire, rank + 1, last_step),)
                finish(a)
                return
            yield (ch.irecv(scratch_wire, rank - 1, 0),)
            reduce(cur, scratch, dst)
            cur, cur_wire = dst, wire
            newrank = rank // 2
        else:
            newrank = rank - rem
        mask, step = 1, 1
        while mask < p:
            newpeer = newrank ^ mask
            peer = newpeer * 2 + 1 if newpeer < rem else newpeer + rem
            yield (ch.isend(cur_wire, peer, step), ch.irecv(scratch_wire, peer, step))
            reduce(cur, scratch, dst)
            cur, cur_wire = dst, wire
            mask <<= 1
            step += 1
        if rank < 2 * rem:
            yield (ch.isend(wire, rank - 1, last_step),)
        finish(a)


def build(args: CollArgs) -> Task:
    return RecursiveDoublingAllreduce(args, name=args.name)
