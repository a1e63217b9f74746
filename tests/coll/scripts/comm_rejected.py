"""Run under mpiexec by tests/coll/test_mpi.py: a call ``pycoll.mpi.Comm`` rejects (a wrong
count, an op it does not have, a root out of range, a malformed buffer specification, mixed
dtypes) raises on every rank and leaves the communicator as usable as before: the next valid
collective on it gives the right result everywhere. And elements without a native type of their
own (``long double``, ``complex long double``) move as mpi4py moves them, and their reductions,
which pycoll has not, are handed to MPI; so are derived datatypes, IN_PLACE where pycoll has no
in-place form, and device memory; DLPack buffers run on pycoll. A v-collective whose counts are
wrong on one rank only raises on every rank at once."""

import time

import numpy as np
from mpi4py import MPI

from pycoll import MismatchError
from pycoll.mpi import Comm
from tests.rank import run_rank


def rejected(comm, r, n):
    """(name, call) of calls every rank rejects before anything is sent."""
    yield "recvbuf of the wrong size", lambda: comm.Allgather(np.ones(4), np.empty(4 * n - 1))
    yield "MAXLOC of doubles (handed to MPI, which refuses it)", lambda: comm.Allreduce(
        np.ones(4), np.empty(4), op=MPI.MAXLOC)
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
        # reductions of them: pycoll has none; the Comm hands them to MPI (blocking, non-blocking,
        # persistent), on every rank alike
        x = np.arange(6, dtype=dtype) + r
        want = np.empty_like(x)
        world.Allreduce(x, want, op=MPI.SUM)
        for form in ("blocking", "non-blocking", "persistent"):
            got = np.zeros_like(x)
            if form == "blocking":
                comm.Allreduce(x, got, op=MPI.SUM)
            elif form == "non-blocking":
                comm.Iallreduce(x, got, op=MPI.SUM).Wait()
            else:
                req = comm.Allreduce_init(x, got, op=MPI.SUM)
                req.Start()
                req.Wait()
                req.Free()
            assert np.array_equal(got, want), f"{form} Allreduce of {np.dtype(dtype)}: {got} != {want}"


class DLPackOnly:
    """Host memory exported by DLPack alone (no buffer protocol), as mpi4py's tests make it."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, stream=None):
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


class DeviceLike:
    """An object that says it is device memory (``__cuda_array_interface__``; here it points at
    host memory, as mpi4py's fake GPU arrays do): the Comm hands its calls to MPI."""

    def __init__(self, arr):
        self.arr = arr
        self.__cuda_array_interface__ = {"shape": arr.shape, "typestr": arr.dtype.str,
                                         "data": (arr.ctypes.data, False), "version": 3}


def user_ops(comm, world, r, n):
    """Ops pycoll has not (user-defined from ``MPI.Op.Create``, commutative or not, MAXLOC with
    a pair type) are handed to MPI, in every form: mpi4py's values."""
    def add(a, b, t):
        np.add(np.frombuffer(a), np.frombuffer(b), out=np.frombuffer(b))

    def left(a, b, t):  # not commutative: keeps the lower rank's operand
        np.frombuffer(b)[:] = np.frombuffer(a)

    x = np.arange(5.0) * (r + 1)
    for commute, fn in ((True, add), (False, left)):
        op = MPI.Op.Create(fn, commute)
        want = np.zeros(5)
        world.Allreduce(x, want, op=op)
        for form in ("blocking", "non-blocking", "persistent", "reduce"):
            got = np.zeros(5)
            if form == "blocking":
                comm.Allreduce(x, got, op=op)
            elif form == "non-blocking":
                comm.Iallreduce(x, got, op=op).Wait()
            elif form == "persistent":
                req = comm.Allreduce_init(x, got, op=op)
                req.Start()
                req.Wait()
                req.Free()
            else:
                comm.Reduce(x, got, op=op, root=n - 1)
                if r != n - 1:
                    continue
            assert np.array_equal(got, want), f"{form} with a user op (commute={commute}): {got} != {want}"
        op.Free()
    pairs = np.array([(float(r), r), (float(-r), r)], dtype=np.dtype([("v", "f8"), ("i", "i4")], align=True))
    got, want = np.zeros_like(pairs), np.zeros_like(pairs)
    comm.Allreduce([pairs, MPI.DOUBLE_INT], [got, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    world.Allreduce([pairs, MPI.DOUBLE_INT], [want, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    assert (got == want).all(), f"MAXLOC: {got} != {want}"


def handed_or_exported(comm, world, r, n):
    """DLPack buffers run on pycoll; derived datatypes, IN_PLACE where pycoll has no in-place
    form, and device memory go to MPI: every one leaves mpi4py's values."""
    x = np.arange(8.0) + r
    got, want = np.zeros(8), np.zeros(8)
    comm.Allreduce(DLPackOnly(x), DLPackOnly(got), op=MPI.SUM)
    world.Allreduce(x, want, op=MPI.SUM)
    assert np.array_equal(got, want), f"DLPack Allreduce: {got} != {want}"
    got = np.zeros(8)
    comm.Allreduce(DeviceLike(x), DeviceLike(got), op=MPI.SUM)
    assert np.array_equal(got, want), f"device-like Allreduce: {got} != {want}"
    for form in ("blocking", "persistent"):  # keyword arguments (root=, op=) reach MPI too
        got, want = np.zeros(8), np.zeros(8)
        world.Reduce(x, want, op=MPI.MAX, root=n - 1)
        if form == "blocking":
            comm.Reduce(DeviceLike(x), DeviceLike(got), op=MPI.MAX, root=n - 1)
        else:
            req = comm.Reduce_init(DeviceLike(x), DeviceLike(got), op=MPI.MAX, root=n - 1)
            req.Start()
            req.Wait()
            req.Free()
        if r == n - 1:
            assert np.array_equal(got, want), f"{form} device-like Reduce(MAX, root={n - 1}): {got} != {want}"
    for c, out in ((comm, np.full(10, -1, np.int32)), (world, np.full(10, -1, np.int32))):
        if r == 0:
            out[:] = np.arange(10)
        every_other = MPI.INT.Create_indexed_block(1, list(range(0, 10, 2))).Commit()
        c.Bcast((out, 1, every_other), root=0)
        every_other.Free()
        if c is comm:
            got = out
    assert np.array_equal(got, out), f"indexed Bcast: {got} != {out}"
    for name in ("Alltoall", "Reduce_scatter_block"):
        outs = []
        for c in (comm, world):
            buf = np.arange(2.0 * n) + 10 * r
            getattr(c, name)(MPI.IN_PLACE, buf) if name == "Alltoall" else c.Reduce_scatter_block(
                MPI.IN_PLACE, buf, op=MPI.SUM)
            outs.append(buf if name == "Alltoall" else buf[:2])
        assert np.array_equal(outs[0], outs[1]), f"{name} in place: {outs[0]} != {outs[1]}"


def one_rank_wrong(n):
    """(name, call(comm, r)) of v-collectives whose counts are wrong on one rank only: a root's
    counts of the wrong length, or that give a rank another size than it sends or expects; one
    rank's allgatherv, alltoallv or reduce_scatter counts unlike the others'."""
    last = n - 1

    def gatherv(length, bad):
        def call(comm, r):
            counts = [2] * n
            counts[last] = bad
            counts = counts[:length]
            recv = [np.zeros(4 * n), (counts, None), MPI.DOUBLE] if r == 0 else None
            comm.Gatherv(np.full(2, r + 1.0), recv, root=0)
        return call

    def scatterv(length, bad):
        def call(comm, r):
            counts = [2] * n
            counts[last] = bad
            counts = counts[:length]
            send = [np.ones(4 * n), (counts, None), MPI.DOUBLE] if r == 0 else None
            comm.Scatterv(send, np.zeros(2), root=0)
        return call

    def allgatherv(counts_of_last):
        def call(comm, r):
            counts = counts_of_last if r == last else [2] * n
            comm.Allgatherv(np.ones(2), [np.zeros(4 * n), counts, MPI.DOUBLE])
        return call

    def alltoallv(comm, r):
        recvcounts = [2] * n
        if r == last:
            recvcounts[0] = 3
        comm.Alltoallv([np.ones(2 * n), [2] * n, MPI.DOUBLE], [np.zeros(4 * n), recvcounts, MPI.DOUBLE])

    def reduce_scatter(comm, r):
        counts = [2] * n
        if r == last:
            counts[0], counts[last] = 3, 1
        comm.Reduce_scatter(np.ones(2 * n), np.zeros(counts[r]), counts, op=MPI.SUM)

    yield "Gatherv: the root's counts one short", gatherv(n - 1, 2)
    yield "Gatherv: the root's counts give a rank another size", gatherv(n, 3)
    yield "Scatterv: the root's counts one short", scatterv(n - 1, 2)
    yield "Scatterv: the root's counts give a rank another size", scatterv(n, 1)
    yield "Allgatherv: one rank's counts differ", allgatherv([2] * (n - 1) + [3])
    yield "Allgatherv: one rank's counts one short", allgatherv([2] * (n - 1))
    yield "Alltoallv: one rank expects another size", alltoallv
    yield "Reduce_scatter: one rank's counts differ", reduce_scatter


def errors_everywhere(world, r, n):
    """Each v-collective with wrong counts on one rank raises pycoll.MismatchError (an
    MPI.Exception) on every rank within seconds (not the timeout), whichever rank holds them."""
    for name, call in one_rank_wrong(n):
        comm = Comm(world)
        t0 = time.monotonic()
        try:
            call(comm, r)
        except MismatchError as exc:
            assert isinstance(exc, MPI.Exception), f"{name}: {type(exc)}"
        except Exception as exc:
            raise AssertionError(f"{name}: rank {r} raised {type(exc).__name__}: {exc}") from exc
        else:
            raise AssertionError(f"{name}: rank {r} returned")
        took = time.monotonic() - t0
        assert took < 5, f"{name}: rank {r} raised after {took:.1f} s"
        comm.team.close()
        world.Barrier()


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
    handed_or_exported(comm, world, r, n)
    user_ops(comm, world, r, n)
    still_works(comm, r, n, "the untyped elements")
    errors_everywhere(world, r, n)


if __name__ == "__main__":
    run_rank(main)
