"""Run under mpiexec by tests/test_mpi.py: pycoll.mpi.Comm accepts what mpi4py accepts."""

import traceback

import numpy as np
from mpi4py import MPI

from pycoll.mpi import Comm


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
    comm.Barrier()
    print(f"RANK {r} OK", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        print(f"RANK {MPI.COMM_WORLD.rank} FAILED\n{traceback.format_exc()}", flush=True)
        MPI.COMM_WORLD.Abort(1)
