"""Shared-memory allgather(v) for a team on one host (native state machine in ``native/shm.c``).

Chunk by chunk over the largest block (a slot's worth at a time, double buffered): every rank
copies its piece of its block into its slot of the segment (and into its own block of dst, unless
in place), then copies every other rank's piece out of their slots into their blocks of dst.
Blocks may differ in size and need not lie back to back (``args.layout``). Small messages complete
in a single native call when the peers are there.
"""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.algorithms.shm.blocks import BlockSegmentTask, dst_blocks
from pycoll.dtypes import element_code
from pycoll.tasks.task import Task

NAME = "shm"
COLLECTIVES = ("allgather", "allgatherv")
OPTIONS: Dict[str, Option] = {}
KIND = 4  # PC_COLL_ALLGATHER


class ShmAllgather(BlockSegmentTask):
    def layouts(self, a: CollArgs) -> tuple:
        return dst_blocks(a, self.name), None

    def codes(self) -> tuple:
        return 0, element_code(self.args.dst.dtype)  # the dtype gives the element size only


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmAllgather(args, KIND, args.name)
