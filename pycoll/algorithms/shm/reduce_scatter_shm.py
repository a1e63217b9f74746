"""Shared-memory reduce_scatter(v) for a team on one host (native state machine in
``native/shm.c``).

Chunk by chunk over the largest block (double buffered): every rank copies a piece of each block
of its src into its slot (block b's piece at the b-th n-th of the slot); rank r then reduces the
pieces of block r of all slots, in rank order, straight into its dst. Blocks may differ in size
and need not lie back to back (``args.layout``). AVG divides at the end.
"""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs, finish
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.algorithms.shm.blocks import BlockSegmentTask, src_blocks
from pycoll.dtypes import DTYPE_CODES
from pycoll.ops import OP_CODES, ReduceOp
from pycoll.tasks.task import Task

NAME = "shm"
COLLECTIVES = ("reduce_scatter", "reduce_scatterv")
OPTIONS: Dict[str, Option] = {}
KIND = 5  # PC_COLL_REDUCE_SCATTER


class ShmReduceScatter(BlockSegmentTask):
    def layouts(self, a: CollArgs) -> tuple:
        return src_blocks(a, self.name), None

    def codes(self) -> tuple:
        return OP_CODES[self.args.op], DTYPE_CODES[self.args.dst.dtype]

    def finished(self) -> None:
        if self.args.op is ReduceOp.AVG:
            finish(self.args)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmReduceScatter(args, KIND, args.name)
