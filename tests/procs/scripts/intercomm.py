"""Run under mpiexec (4 ranks) by tests/procs/test_intercomm.py: ``pycoll.mpi.Comm`` over an
intercommunicator hands its collectives to MPI (roots as ``MPI.ROOT``/``MPI.PROC_NULL``, data
across the two groups), gives what it makes back wrapped, and its ``Merge`` is an
intracommunicator whose collectives pycoll runs."""

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll.mpi import Comm
from pycoll.mpi_inter import InterComm
from tests.rank import run_rank


def main():
    world = Comm(MPI.COMM_WORLD)
    r, n = world.rank, world.size
    low = r < n // 2
    local = world.Split(0 if low else 1, r)  # (a Comm: pycoll's)
    assert isinstance(local, Comm), type(local)
    inter = local.Create_intercomm(0, MPI.COMM_WORLD, n // 2 if low else 0, tag=7)
    assert isinstance(inter, InterComm), type(inter)
    assert Comm(inter.comm) == inter and inter.Get_remote_size() == n // 2

    # a rooted collective across the groups: rank 0 of the low group is the root
    buf = np.full(3, 42.0 if r == 0 else -1.0)
    if low:
        inter.Bcast(buf, root=MPI.ROOT if local.rank == 0 else MPI.PROC_NULL)
        assert buf[0] == (42.0 if r == 0 else -1.0), buf
    else:
        inter.Bcast(buf, root=0)
        assert (buf == 42.0).all(), buf
    # an allreduce across: each group gets the other group's sum
    x, y = np.array([float(r)]), np.empty(1)
    inter.Allreduce(x, y, op=MPI.SUM)
    other = range(n // 2, n) if low else range(n // 2)
    assert y[0] == sum(other), (r, y)
    req = inter.Iallgather(np.array([r], np.int64), got := np.empty(n // 2, np.int64))
    req.Wait()
    assert list(got) == list(other), got

    dup = inter.Dup()
    assert isinstance(dup, InterComm)
    dup.Free()

    merged = inter.Merge(high=not low)
    assert isinstance(merged, Comm) and merged.size == n
    before = pycoll.get_context().posted
    out = np.empty(1)
    merged.Allreduce(np.array([1.0]), out, op=MPI.SUM)
    assert out[0] == n and pycoll.get_context().posted > before, "Merge's collectives ran on MPI"
    merged.Free()
    inter.Free()
    local.Free()


if __name__ == "__main__":
    run_rank(main)
