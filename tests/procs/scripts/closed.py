"""Run under mpiexec by tests/procs/test_closed.py: every call on a closed team, and on a
``pycoll.mpi.Comm`` after ``Free()``, raises ``pycoll.ClosedError`` before anything is sent: new
calls, repeated calls (whose persistent forms and express lanes the team kept), persistent starts,
point to point, schedule tasks. A closed team frees its duplicate of the communicator (MPICH has
about 2,000), after a mismatch too. Then a fresh team still computes (nothing of the closed one is
in the way)."""


import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team
from pycoll.mpi import Comm
from tests.rank import run_rank


def refused(what, call):
    try:
        call()
    except pycoll.ClosedError as exc:
        assert "closed" in str(exc), str(exc)
        return
    raise AssertionError(f"{what}: rank {MPI.COMM_WORLD.rank} ran a call on a closed team")


def main():
    world = MPI.COMM_WORLD
    r, n = world.rank, world.size
    team = Team.from_mpi(world)
    x, y = np.full(4, r + 1.0, np.float32), np.empty(4, np.float32)
    for _ in range(3):  # repeated: the team keeps its persistent form (an express lane)
        team.allreduce(x, y).wait(timeout=30)
        team.bcast(x, 0).wait(timeout=30)
    p = team.allreduce_init(x, y)
    p.start().wait(timeout=30)
    own = team.comm  # the team's duplicate of the communicator: freed at close (MPI has ~2,000),
    world.Barrier()  # once every peer's goodbye came (within 2 s: the ranks close together here)
    team.close()
    assert own == MPI.COMM_NULL, f"rank {r}: a closed team kept its communicator"
    refused("repeated allreduce", lambda: team.allreduce(x, y))
    refused("repeated bcast", lambda: team.bcast(x, 0))
    refused("new allgather", lambda: team.allgather(x, np.empty(4 * n, np.float32)))
    refused("persistent start", p.start)
    refused("new persistent", lambda: team.reduce_init(x, y).start())
    refused("isend", lambda: team.isend(x, (r + 1) % n))
    refused("irecv", lambda: team.irecv(y, (r + 1) % n))
    refused("task", lambda: team.task("allreduce", x))
    refused("barrier", team.barrier)

    comm = Comm(world.Dup())
    for _ in range(3):
        comm.Allreduce(x, y, op=MPI.SUM)
    comm.Free()
    try:
        comm.Allreduce(x, y, op=MPI.SUM)
    except pycoll.ClosedError as exc:  # in mpi4py's flavour too
        assert isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_COMM, repr(exc)
    else:
        raise AssertionError(f"rank {r}: Comm.Allreduce ran after Free()")
    refused("Comm.Bcast", lambda: comm.Bcast(x, root=0))

    fresh = Team.from_mpi(world)
    out = fresh.allreduce(np.full(4, r + 1.0, np.float32), y).wait(timeout=30)
    assert (out == n * (n + 1) / 2).all(), out
    fresh.close()

    for _ in range(3):  # a team whose calls went out of step frees its communicator too, and the
        odd = Team.from_mpi(world)  # next team made gets none of its messages
        own = odd.comm
        try:
            odd.allreduce(np.ones(4 + r, np.float32)).wait(timeout=30)
        except pycoll.MismatchError:
            pass
        else:
            raise AssertionError(f"rank {r}: counts 4 and 5 agreed")
        world.Barrier()
        odd.close()
        assert own == MPI.COMM_NULL, f"rank {r}: a closed team kept its communicator"
        fresh = Team.from_mpi(world)
        for _ in range(3):
            out = fresh.allreduce(np.full(4, r + 1.0, np.float32), y).wait(timeout=30)
            assert (out == n * (n + 1) / 2).all(), out
        fresh.close()


if __name__ == "__main__":
    run_rank(main)
