"""Shared-memory scatter(v) for a team on one host (native state machine in ``native/shm.c``).

Chunk by chunk over the largest block (double buffered): the root writes a piece of every block
into its slot, after a header of the blocks' sizes, and goes on; every other rank copies its piece
out. Only the root needs the blocks (``scatterv`` may leave ``counts`` to the root): it says at
the first chunk how many chunks there are, and each rank checks the size the header gives for its
block against its recvbuf (ranks that disagree get an error, never a short copy).
"""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.algorithms.shm.blocks import BlockSegmentTask, src_blocks
from pycoll.dtypes import element_code
from pycoll.tasks.task import Task

NAME = "shm"
COLLECTIVES = ("scatter", "scatterv")
OPTIONS: Dict[str, Option] = {}
KIND = 7  # PC_COLL_SCATTER


class ShmScatter(BlockSegmentTask):
    def layouts(self, a: CollArgs) -> tuple:
        return (src_blocks(a, self.name, own=a.root) if a.rank == a.root else None), None

    def codes(self) -> tuple:
        return 0, element_code(self.args.dst.dtype)  # the dtype gives the element size only


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmScatter(args, KIND, args.name)
