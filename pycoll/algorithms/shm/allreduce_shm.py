"""Shared-memory allreduce for a team on one host (native state machine in ``native/shm.c``).

Chunk by chunk (a slot's worth at a time, double buffered): every rank copies its chunk into its
slot of the segment; each rank reduces its 1/n of the chunk reading all slots in rank order (so
every rank gets bitwise the same result) into the shared result area; every rank copies the
result out. Per rank that is one read of the input and one write of the output from memory;
the slots and the result stay in cache. Small messages (one chunk) complete in a single native
call when the peers are there.
"""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs, SegmentTask, finish
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.dtypes import DTYPE_CODES
from pycoll.ops import OP_CODES, ReduceOp
from pycoll.tasks.task import Task

NAME = "shm"
COLLECTIVES = ("allreduce",)
OPTIONS: Dict[str, Option] = {}
KIND = 0  # PC_COLL_ALLREDUCE


class ShmAllreduce(SegmentTask):
    def codes(self) -> tuple:
        return OP_CODES[self.args.op], DTYPE_CODES[self.args.dst.dtype]

    def finished(self) -> None:
        if self.args.op is ReduceOp.AVG:
            finish(self.args)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmAllreduce(args, KIND, args.name)
