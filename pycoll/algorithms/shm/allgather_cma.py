"""Single-copy allgather(v) for a team on one host: every rank reads each peer's block straight
out of the peer's memory with ``process_vm_readv`` (cross-memory attach, as MPICH and Open MPI do
for large messages), instead of copying it through the shared segment (three copies per rank) or
through point-to-point messages.

Step 0: every rank sends each peer the address of its block (8 bytes); it copies its own block
into place, then reads the others' (the GIL is released during each read). Step 1: every rank
tells each peer that it has finished reading, and waits until all have told it, so no block is
changed or freed while a peer still reads it. Needs the team's segment (for the peers' process
ids) and permission to read the peers' memory (checked once when the team is made).
"""

from __future__ import annotations

from typing import Dict, Generator

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire, copy_block
from pycoll.algorithms.options import Option, options
from pycoll.errors import TransportError
from pycoll.tasks.task import Task

NAME = "cma"
COLLECTIVES = ("allgather", "allgatherv")
OPTIONS: Dict[str, Option] = {}

_ONE = np.zeros(1, np.uint64)


class CmaAllgather(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        from pycoll.native import address, ffi, lib  # noqa: PLC0415 - the compiled module: see pycoll.algorithms.shm

        a = self.args
        n, rank, ch, pids = a.size, a.rank, a.channel, a.shared.pids
        blocks = [a.dst[off:off + cnt] for off, cnt in a.layout]
        mine = self.scratch(0, _ONE)
        mine[0] = address(a.src) if a.src.size else 0
        addrs = self.scratch(1, np.zeros(n, np.uint64))
        peers = [(rank + i) % n for i in range(1, n)]  # each rank starts with a different peer
        yield ([ch.isend(as_wire(mine), p, 0) for p in peers]
               + [ch.irecv(as_wire(addrs[p:p + 1]), p, 0) for p in peers])
        copy_block(blocks[rank], a.src)
        for p in peers:
            block = blocks[p]
            if block.nbytes:
                got = lib.pycoll_cma_read(pids[p], ffi.from_buffer(block), int(addrs[p]), block.nbytes)
                if got != block.nbytes:
                    raise TransportError(f"allgather:cma: cannot read {block.nbytes} B of rank {p}'s memory "
                                         f"(error {-got})")
        acks = self.scratch(2, np.zeros(n, np.uint64))
        yield ([ch.isend(as_wire(mine), p, 1) for p in peers]
               + [ch.irecv(as_wire(acks[p:p + 1]), p, 1) for p in peers])


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    if args.shared is None or not getattr(args.shared, "cma", False):
        raise ValueError(f"{args.coll}: algorithm 'cma' needs a team on one host whose ranks may read "
                         "each other's memory (process_vm_readv)")
    return CmaAllgather(args, name=args.name)
