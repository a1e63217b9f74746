"""Single-copy allreduce of the ranks' own buffers for a team on one host (native,
``native/shm.c``), the plan of the ``mapped`` form without ``team.alloc``.

Rank i owns 1/n of the elements and reduces them in rank order, a cache-sized block at a time:
the peers' blocks of input are read straight out of their memory with ``process_vm_readv`` (the
kernel copies them into a buffer that stays in cache), and the reduced block is written straight
into every peer's output with ``process_vm_writev``. Per rank that is one read of M bytes and one
write of M bytes from memory, where the ``shm`` form copies through the segment's slots
((5 - 1/n) M), for 2 (n - 1) system calls per block: it pays for large messages on many ranks.
No rank reads or writes another's share, so in place needs no barrier between the reduction and
the writes: one generation on the segment carries the ranks' addresses, and every rank returns
once all have written their share.
"""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm.allreduce_shm import ShmAllreduce
from pycoll.algorithms.shm.cma import cma_segment_of
from pycoll.tasks.task import Task

NAME = "cma"
SEGMENT = True  # addresses published in the segment: untagged calls only
COLLECTIVES = ("allreduce",)
OPTIONS: Dict[str, Option] = {}
KIND = 16  # PC_COLL_ALLREDUCE_CMA (segment.COLL_ALLREDUCE_CMA)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    cma_segment_of(args)
    return ShmAllreduce(args, KIND, args.name)
