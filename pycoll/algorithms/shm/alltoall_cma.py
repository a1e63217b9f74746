"""Single-copy alltoall(v) for a team on one host (native, ``native/shm.c``): every rank publishes
the address and size of each block of its sendbuf in the segment; every rank checks the size of
each block it receives against its receive layout and reads it straight out of the sender's
memory (``process_vm_readv``), each rank starting with a different peer; a rank returns once
every peer has read from it. One copy per byte where the ``shm`` form makes two. Blocks up to the
segment's ``cma_inline`` bytes (while they fit) the sender copies into its slot instead, and says
so in the block's entry: a small block costs a copy in and out, not a system call, and a rank
whose blocks all went that way waits for nobody.

In place (sendbuf and recvbuf overlap) a peer could read a block this rank has already
overwritten: such a call runs the ``shm`` form, which reads each piece before it writes it (MPI's
in-place alltoall is in place on every rank, so all ranks take the same form).
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import alltoall_shm
from pycoll.algorithms.shm.alltoall_shm import ShmAlltoall
from pycoll.algorithms.shm.cma import cma_segment_of
from pycoll.tasks.task import Task

NAME = "cma"
SEGMENT = True  # addresses published in the segment: untagged calls only
COLLECTIVES = ("alltoall", "alltoallv")
OPTIONS: Dict[str, Option] = {}
KIND = 12  # PC_COLL_ALLTOALL_CMA


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    cma_segment_of(args)
    if np.may_share_memory(args.src, args.dst):
        return ShmAlltoall(args, alltoall_shm.KIND, args.name)
    return ShmAlltoall(args, KIND, args.name)
