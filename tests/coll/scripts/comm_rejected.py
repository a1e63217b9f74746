"""Run under mpiexec by tests/coll/test_mpi.py: a call ``pycoll.mpi.Comm`` rejects (a dtype it
cannot reduce, a wrong count, an op it does not have, a root out of range, a malformed buffer
specification) raises on every rank and leaves the communicator as usable as before: the next
valid collective on it gives the right result everywhere. And elements without a native code of
their own (``long double``, ``complex long double``) move as mpi4py moves them."""

import numpy as np
from mpi4py import MPI

from pycoll.mpi import Comm
from tests.rank import run_rank


def rejected(comm, r, n):
    """(name, call) of calls every rank rejects before anything is sent."""
    yield "long double sum", lambda: comm.Allreduce(np.ones(4, np.longdouble), np.empty(4, np.longdouble),
                                                    op=MPI.SUM)
    yield "recvbuf of the wrong size", lambda: comm.Allgather(np.ones(4), np.empty(4 * n - 1))
    yield "op pycoll does not have", lambda: comm.Allreduce(np.ones(4), np.empty(4), op=MPI.MAXLOC)
    yield "root out of range", lambda: comm.Bcast(np.ones(4), root=n + 3)
    yield "malformed buffer specification", lambda: comm.Allreduce([np.ones(4), "x"], np.empty(4), op=MPI.SUM)
    yield "sendbuf and recvbuf of different dtypes", lambda: comm.Allreduce(
        np.ones(4), np.empty(4, np.float32), op=MPI.SUM)


def still_works(comm, r, n, after):
    x, y = np.full(100, r + 1.0), np.empty(100)
    comm.Allreduce(x, y, op=MPI.SUM)
    assert (y == n * (n + 1) / 2).all(), f"after {after}: {y[:4]}"
    z = np.full(5, float(r))
    comm.Bcast(z, root=n - 1)
    assert (z == n - 1).all(), f"after {after}: bcast {z}"


def block(k, dtype):
    """4 elements of ``dtype`` whose bytes are a pattern of ``k``."""
    out = np.zeros(4, dtype)
    raw = out.view(np.uint8)
    raw[:] = (np.arange(raw.size) + 17 * k) % 251
    return out


def moved(c, name, dtype, r, n):
    """What collective ``name`` leaves in this rank's output on communicator ``c``."""
    if name == "Allgather":
        out = np.zeros(4 * n, dtype)
        c.Allgather(block(r, dtype), out)
    elif name == "Alltoall":
        out = np.zeros(4 * n, dtype)
        c.Alltoall(np.concatenate([block(r * n + q, dtype) for q in range(n)]), out)
    elif name == "Gather":
        out = np.zeros(4 * n, dtype) if r == 0 else None
        c.Gather(block(r, dtype), out, root=0)
    elif name == "Scatter":
        out = np.zeros(4, dtype)
        c.Scatter(np.concatenate([block(q, dtype) for q in range(n)]) if r == 0 else None, out, root=0)
    else:
        out = block(9, dtype) if r == 0 else np.zeros(4, dtype)
        c.Bcast(out, root=0)
    return out


def untyped_elements(comm, world, r, n):
    """Movement collectives of long double and complex long double (no native type of their own:
    16 bytes move as another 16-byte type, 32 bytes off the segment) leave mpi4py's values."""
    for dtype in (np.longdouble, np.clongdouble):
        for name in ("Allgather", "Alltoall", "Gather", "Scatter", "Bcast"):
            got, want = moved(comm, name, dtype, r, n), moved(world, name, dtype, r, n)
            if want is not None:
                assert got.tobytes() == want.tobytes(), f"{name} of {np.dtype(dtype)}: not mpi4py's values"


def main():
    world = MPI.COMM_WORLD
    r, n = world.rank, world.size
    comm = Comm(world)
    still_works(comm, r, n, "nothing")
    for name, call in rejected(comm, r, n):
        try:
            call()
        except (TypeError, ValueError, MPI.Exception) as exc:
            assert "unusable" not in str(exc) and "did not finish" not in str(exc), f"{name}: {exc}"
        else:
            raise AssertionError(f"{name}: pycoll.mpi.Comm accepted it")
        still_works(comm, r, n, name)
    untyped_elements(comm, world, r, n)
    still_works(comm, r, n, "the untyped elements")


if __name__ == "__main__":
    run_rank(main)
