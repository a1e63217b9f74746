"""Single-copy scatter(v) for a team on one host (native, ``native/shm.c``): the root publishes
the address and size of every block of its sendbuf in the segment; every other rank checks the
size of its block against its recvbuf and reads it straight out of the root's memory
(``process_vm_readv``); the root returns once all have read. One copy per byte where the ``shm``
form makes two. Blocks up to the segment's ``cma_inline`` bytes (while they fit) the root copies
into its slot instead, and says so in the block's entry: a small block costs a copy in and out,
not a system call, and the root waits for nobody when every block went that way.
"""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm.cma import cma_segment_of
from pycoll.algorithms.shm.scatter_shm import ShmScatter
from pycoll.tasks.task import Task

NAME = "cma"
SEGMENT = True  # addresses published in the segment: untagged calls only
COLLECTIVES = ("scatter", "scatterv")
OPTIONS: Dict[str, Option] = {}
KIND = 11  # PC_COLL_SCATTER_CMA


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    cma_segment_of(args)
    return ShmScatter(args, KIND, args.name)
