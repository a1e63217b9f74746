"""Shared-memory gather(v) for a team on one host (native state machine in ``native/shm.c``).

Chunk by chunk over the largest block (a slot's worth at a time, double buffered): every rank
but the root copies its piece of its block into its slot and goes on (eager: it waits for nobody
once the root has said how many chunks there are); the root copies the pieces out into their
blocks of recvbuf. Only the root needs the blocks (``gatherv`` may leave ``counts`` to the root):
it says at the first chunk how many chunks there are, and checks every rank's block size against
its counts (ranks that disagree get an error, never a short copy). In a ``gather`` every rank
knows the chunks (equal blocks), so past the first collectives the others do not wait for the
root's word at all: each goes on once its pieces are in its slot, and compares its call with the
root's within its next two calls or when its team closes (``goes_eagerly`` and ``settle`` in
``native/shm.c``).
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
COLLECTIVES = ("gather", "gatherv")
OPTIONS: Dict[str, Option] = {}
KIND = 6  # PC_COLL_GATHER


class ShmGather(BlockSegmentTask):
    def __init__(self, args: CollArgs, kind: int, name: str) -> None:
        super().__init__(args, kind, name)
        self.native.equal = args.coll == "gather"  # (every block the size of this rank's: not gatherv)

    def layouts(self, a: CollArgs) -> tuple:
        return (dst_blocks(a, self.name) if a.rank == a.root else None), None

    def codes(self) -> tuple:
        return 0, element_code(self.args.src.dtype)  # the dtype gives the element size only


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmGather(args, KIND, args.name)
