"""Shared-memory scan and exscan (prefix reductions) for a team on one host (native state machine
in ``native/shm.c``).

Chunk by chunk (a slot's worth at a time, double buffered): every rank copies its chunk into its
slot of the segment; rank r reduces the slots of ranks 0..r (exscan: 0..r-1), in rank order as
MPI does, straight into its dst. Small messages on 2 ranks travel inline next to each rank's flag. The
exscan leaves rank 0's dst as it was (MPI leaves it undefined), as ``rd`` does.
"""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs, SegmentTask
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.dtypes import DTYPE_CODES
from pycoll.ops import OP_CODES
from pycoll.tasks.task import Task

NAME = "shm"
COLLECTIVES = ("scan", "exscan")
OPTIONS: Dict[str, Option] = {}
KINDS = {"scan": 14, "exscan": 15}  # PC_COLL_SCAN, PC_COLL_EXSCAN (segment.COLL_SCAN, COLL_EXSCAN)


class ShmScan(SegmentTask):
    def codes(self) -> tuple:
        return OP_CODES[self.args.op], DTYPE_CODES[self.args.dst.dtype]


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmScan(args, KINDS[args.coll], args.name)
