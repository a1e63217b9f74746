"""Single-copy bcast for a team on one host (native, ``native/shm.c``): the root publishes its
buffer's address and size in the segment; every other rank checks the size against its own and
reads the buffer straight out of the root's memory (``process_vm_readv``); the root returns once
all have read it. One copy per byte where the ``shm`` form makes two (into the segment and out),
for one system call per rank: it pays for larger messages (see the selection table).
"""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm.bcast_shm import ShmBcast
from pycoll.algorithms.shm.cma import cma_segment_of
from pycoll.tasks.task import Task

NAME = "cma"
SEGMENT = True  # addresses published in the segment: untagged calls only
COLLECTIVES = ("bcast",)
OPTIONS: Dict[str, Option] = {}
KIND = 9  # PC_COLL_BCAST_CMA


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    cma_segment_of(args)
    return ShmBcast(args, KIND, args.name)  # the team passes the buffer as bytes
