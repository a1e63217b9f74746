"""Single-copy gather(v) for a team on one host (native, ``native/shm.c``): every rank publishes
its sendbuf's address and size in the segment; the root checks each size against its layout and
reads each block straight out of the sender's memory (``process_vm_readv``) into place; a sender
returns once the root has read. One copy per byte where the ``shm`` form makes two.
"""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm.cma import cma_segment_of
from pycoll.algorithms.shm.gather_shm import ShmGather
from pycoll.tasks.task import Task

NAME = "cma"
SEGMENT = True  # addresses published in the segment: untagged calls only
COLLECTIVES = ("gather", "gatherv")
OPTIONS: Dict[str, Option] = {}
KIND = 10  # PC_COLL_GATHER_CMA


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    cma_segment_of(args)
    return ShmGather(args, KIND, args.name)
