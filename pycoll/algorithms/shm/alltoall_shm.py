"""Shared-memory alltoall(v) for a team on one host (native state machine in ``native/shm.c``).

Chunk by chunk over the largest block (double buffered): every rank writes a piece of each of its
send blocks into its slot (the one for rank b at the b-th n-th of the slot), after a header of the
blocks' sizes; every rank then copies its piece out of every slot into its receive blocks. One
write and one read per byte, against the n - 1 messages of the pairwise exchange. The ranks agree
on the number of chunks at the first (the largest any rank's blocks need), and each checks the
sizes in the senders' headers against its receive counts.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from pycoll.algorithms.base import CollArgs, equal_layout
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.algorithms.shm.blocks import BlockSegmentTask, checked_blocks
from pycoll.dtypes import element_code
from pycoll.tasks.task import Task

NAME = "shm"
COLLECTIVES = ("alltoall", "alltoallv")
OPTIONS: Dict[str, Option] = {}
KIND = 8  # PC_COLL_ALLTOALL


class ShmAlltoall(BlockSegmentTask):
    def layouts(self, a: CollArgs) -> tuple:
        n = a.size
        send = a.layout if a.layout is not None else equal_layout(a.src.size // n, n)
        recv = a.rlayout if a.rlayout is not None else equal_layout(a.dst.size // n, n)
        sl = checked_blocks(send, n, a.src.size, None, self.name, "sendbuf")
        rl = checked_blocks(recv, n, a.dst.size, None, self.name, "recvbuf")
        if sl[2 * a.rank + 1] != rl[2 * a.rank + 1]:
            raise ValueError(f"{self.name}: rank {a.rank} sends itself {sl[2 * a.rank + 1]} elements "
                             f"but receives {rl[2 * a.rank + 1]}")
        # A chunk reads its pieces of sendbuf after the chunk before wrote recvbuf: one buffer for
        # both works only with the same blocks (each piece is read before it is overwritten).
        if np.may_share_memory(a.src, a.dst) and not (a.src.ctypes.data == a.dst.ctypes.data
                                                      and np.array_equal(sl, rl)):
            raise ValueError(f"{self.name}: sendbuf and recvbuf overlap; in place needs the same "
                             "send and receive blocks")
        return sl, rl

    def codes(self) -> tuple:
        return 0, element_code(self.args.dst.dtype)  # the dtype gives the element size only


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmAlltoall(args, KIND, args.name)
