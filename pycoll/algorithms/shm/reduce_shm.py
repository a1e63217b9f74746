"""Shared-memory reduce for a team on one host (native state machine in ``native/shm.c``).

The allreduce's path (chunk by chunk, a slot's worth at a time, double buffered): every rank
copies its chunk into its slot; each rank reduces its 1/n of the chunk reading all slots in rank
order into the shared result area, so the root gets bitwise what the shm allreduce computes; only
the root waits for the whole result and copies it out. The other ranks never write their buffer
and go on to the next chunk at once.
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
COLLECTIVES = ("reduce",)
OPTIONS: Dict[str, Option] = {}
KIND = 3  # PC_COLL_REDUCE


class ShmReduce(SegmentTask):
    def codes(self) -> tuple:
        return OP_CODES[self.args.op], DTYPE_CODES[self.args.src.dtype]

    def finished(self) -> None:
        a = self.args
        if a.op is ReduceOp.AVG and a.rank == a.root:
            finish(a)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmReduce(args, KIND, args.name)  # no credit, as every segment collective
