"""Run under mpiexec (2 ranks) by tests/coll/test_mpi.py: a small marked message over MPI lands in
a stage its channel keeps for the next call (requests.Stage), and that stage keeps nothing of the
caller's buffer: once the call is done and the caller lets go of its array, the array is gone (a
view kept in the stage pinned a caller's bytearray or mmap: no resize, no close). The payload
arrives right, on the same stage call after call."""

import weakref

import numpy as np
from mpi4py import MPI

from pycoll.tl.marks import Mark
from pycoll.tl.mpi.transport import MPITransport
from tests.rank import run_rank


class Owner:
    def judge(self, mark, peer, theirs, nbytes, expected):
        raise AssertionError(f"a mark from rank {peer} differs: {theirs!r}, {nbytes} of {expected} B")


def main() -> None:
    world = MPI.COMM_WORLD
    rank, peer = world.Get_rank(), 1 - world.Get_rank()
    channel = MPITransport(world.Dup()).channel(("c", 1))
    channel.mark = Mark(bytes(24), Owner())
    channel.mark.stamp(7)
    stages = set()
    for i in range(5):
        out = np.zeros(8, np.uint8)
        req = channel.exchange(np.full(8, 10 * rank + i, np.uint8), out, peer, 0)
        while not req.test():
            pass
        assert (out == 10 * peer + i).all(), (i, out)
        stages.add(id(req.stage))
        gone = weakref.ref(out)
        del out, req
        assert gone() is None, "the channel keeps the caller's receive buffer alive"
    assert len(stages) == 1 and len(channel.stages) == 1, (stages, channel.stages)


if __name__ == "__main__":
    run_rank(main)
