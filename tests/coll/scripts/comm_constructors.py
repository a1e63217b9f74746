"""Run under mpiexec by tests/coll/test_mpi.py: every communicator constructor of pycoll.mpi.Comm
returns a pycoll.mpi.Comm whose collectives run on pycoll (MPI's COMM_NULL stays null)."""

import numpy as np
from mpi4py import MPI

from pycoll.mpi import Comm
from tests.rank import run_rank


def check(comm, what):
    """``comm`` is a pycoll Comm over the right ranks and its Allreduce runs on pycoll's engine."""
    assert isinstance(comm, Comm), (what, type(comm))
    ctx = comm.team.ctx
    before = ctx.posted
    x = np.full(3, comm.Get_rank() + 1, np.int64)
    y = np.empty_like(x)
    comm.Allreduce(x, y)
    n = comm.Get_size()
    assert (y == n * (n + 1) // 2).all(), (what, y)
    assert ctx.posted > before, what  # (through pycoll, not handed to mpi4py)


def main():
    world = Comm(MPI.COMM_WORLD)
    n, r = world.Get_size(), world.Get_rank()
    made = {"Dup": world.Dup(), "Clone": world.Clone(), "Dup_with_info": world.Dup_with_info(MPI.INFO_NULL),
            "Split": world.Split(r % 2, r), "Split_type": world.Split_type(MPI.COMM_TYPE_SHARED),
            "Create": world.Create(world.Get_group()),
            "Create_group": world.Create_group(world.Get_group().Incl(list(range(n - 1, -1, -1))))}
    dup, request = world.Idup()
    assert request == MPI.REQUEST_NULL
    made["Idup"] = dup
    for what, comm in made.items():
        check(comm, what)
    assert made["Split"].Get_size() == (n + 1 - r % 2) // 2
    assert made["Create_group"].Get_rank() == n - 1 - r  # (the group in reverse order)
    # a sub-communicator's own constructors stay on pycoll too
    check(made["Split"].Dup(), "Split().Dup()")
    # ranks outside the new communicator get MPI's COMM_NULL
    rest = world.Split(MPI.UNDEFINED if r == 0 else 0, r)
    assert (rest == MPI.COMM_NULL) == (r == 0)
    if r != 0:
        check(rest, "Split without rank 0")
        rest.Free()
    odd = world.Create(world.Get_group().Incl([0]))
    assert (odd == MPI.COMM_NULL) == (r != 0)
    if r == 0:
        check(odd, "Create of rank 0 alone")
    for comm in made.values():
        comm.Free()
    try:
        world.Free()  # MPI refuses to free COMM_WORLD, and the Comm stays usable
    except MPI.Exception:
        pass
    check(world, "COMM_WORLD after a refused Free")


if __name__ == "__main__":
    run_rank(main)
