"""Run under mpiexec by tests/test_mpi.py: pycoll.mpi.Comm accepts what mpi4py accepts."""


import numpy as np
from mpi4py import MPI

from pycoll.mpi import Comm
from tests.mpi.common import run_rank


def main():
    world = MPI.COMM_WORLD
    comm = Comm(world)
    n, r = comm.Get_size(), comm.Get_rank()
    assert (comm.rank, comm.size) == (world.rank, world.size)
    a = np.arange(10, dtype=np.float32) + r
    b = np.empty_like(a)
    comm.Allreduce(a, b, op=MPI.SUM)
    ref = np.empty_like(a)
    world.Allreduce(a, ref, op=MPI.SUM)
    assert np.array_equal(b, ref)
    # buffer specs
    c = np.zeros(10, np.float32)
    comm.Allreduce([a, MPI.FLOAT], [c, MPI.FLOAT], op=MPI.MAX)
    assert np.array_equal(c, np.arange(10) + n - 1)
    d = np.zeros(10, np.float64)
    comm.Allreduce([np.full(4, r, np.float64), 4, MPI.DOUBLE], [d, (4, 3), MPI.DOUBLE], op=MPI.MIN)
    assert d[3:7].tolist() == [0.0] * 4 and d[0] == 0 and d[7] == 0
    raw = bytearray(np.full(3, r + 1, np.int32).tobytes())
    comm.Allreduce(MPI.IN_PLACE, [raw, MPI.INT], op=MPI.PROD)
    assert np.frombuffer(raw, np.int32).tolist() == [int(np.prod(np.arange(1, n + 1)))] * 3
    e = np.full(5, r, np.int64)
    req = comm.Iallreduce(MPI.IN_PLACE, e, op=MPI.BXOR)
    req.Wait()
    want = 0
    for rr in range(n):
        want ^= rr
    assert (e == want).all()
    pending = Comm(world).Iallreduce(np.ones(2), np.empty(2))
    assert pending.Test() in (True, False)
    assert pending.Wait() is True
    # what pycoll does not implement passes through to mpi4py
    assert comm.allreduce(r) == sum(range(n))
    try:
        comm.Allreduce(np.ones(3, np.float32), np.empty(3, np.float32), op=MPI.BAND)
    except ValueError as exc:
        assert "BAND" in str(exc)
    else:
        raise AssertionError("BAND on float32 should be refused")
    # the other collectives, checked against mpi4py's own
    x = np.arange(6, dtype=np.float64) + r
    b1 = x.copy() if r == 0 else np.zeros(6)
    comm.Bcast([b1, MPI.DOUBLE], root=0)
    assert np.array_equal(b1, np.arange(6.0))
    red, ref = np.zeros(6), np.zeros(6)
    comm.Reduce(x, red, op=MPI.MAX, root=n - 1)
    world.Reduce(x, ref, op=MPI.MAX, root=n - 1)
    assert r != n - 1 or np.array_equal(red, ref)
    ag, ref = np.zeros(6 * n), np.zeros(6 * n)
    comm.Allgather(x, ag)
    world.Allgather(x, ref)
    assert np.array_equal(ag, ref)
    rs, ref = np.zeros(2), np.zeros(2)
    comm.Reduce_scatter_block(np.arange(2.0 * n) * (r + 1), rs, op=MPI.SUM)
    world.Reduce_scatter_block(np.arange(2.0 * n) * (r + 1), ref, op=MPI.SUM)
    assert np.array_equal(rs, ref)
    a2a, ref = np.zeros(2 * n), np.zeros(2 * n)
    comm.Alltoall(np.arange(2.0 * n) + 100 * r, a2a)
    world.Alltoall(np.arange(2.0 * n) + 100 * r, ref)
    assert np.array_equal(a2a, ref)
    g, ref = np.zeros(6 * n), np.zeros(6 * n)
    comm.Gather(x, g, root=0)
    world.Gather(x, ref, root=0)
    assert r != 0 or np.array_equal(g, ref)
    sc, ref = np.zeros(3), np.zeros(3)
    whole = np.arange(3.0 * n)
    comm.Scatter(whole, sc, root=n - 1)
    world.Scatter(whole, ref, root=n - 1)
    assert np.array_equal(sc, ref)
    comm.Ibarrier().Wait()
    comm.Barrier()


if __name__ == "__main__":
    run_rank(main)
