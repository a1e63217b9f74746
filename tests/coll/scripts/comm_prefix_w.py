"""Run under mpiexec by tests/coll/test_mpi.py: ``Scan``/``Exscan``, ``Alltoallw`` and the in-place
``Alltoall(v)``/``Reduce_scatter(_block)`` of ``pycoll.mpi.Comm`` (blocking, non-blocking and
persistent, restarted on refilled buffers) leave the same values as mpi4py's own communicator,
and went through pycoll's engine (not handed to MPI)."""

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll.mpi import Comm
from tests.rank import run_rank

SENTINEL = -7


def engine(ctx, fn):
    """Run ``fn``; assert that pycoll's engine started work meanwhile."""
    before = ctx.posted
    fn()
    assert ctx.posted > before, "handed to MPI"


def check_prefix(comm, mine):
    r = comm.rank
    ctx = pycoll.get_context()
    for name in ("Scan", "Exscan"):
        for op in (MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN, MPI.BXOR):
            for dtype in (np.int64, np.float64, np.int8):
                if op == MPI.BXOR and dtype == np.float64:
                    continue
                for count in (0, 1, 7, 3000):
                    src = (np.arange(count) % 5 + r + 1).astype(dtype)
                    want, got = np.full(count, SENTINEL, dtype), np.full(count, SENTINEL, dtype)
                    getattr(comm, name)(src, want, op)
                    engine(ctx, lambda: getattr(mine, name)(src, got, op))  # noqa: B023
                    exscan0 = name == "Exscan" and r == 0  # (MPI leaves rank 0's output undefined)
                    assert exscan0 or np.array_equal(got, want), (name, op, dtype, count)
                    # in place, non-blocking
                    inp = src.copy()
                    getattr(mine, f"I{name[0].lower()}{name[1:]}")(MPI.IN_PLACE, inp, op).Wait()
                    if name == "Scan" or r:
                        assert np.array_equal(inp, want), (name, "in place", op, dtype, count)
    # persistent, refilled between starts
    buf, out = np.zeros(10, np.int64), np.zeros(10, np.int64)
    req = mine.Scan_init(buf, out, MPI.SUM)
    for k in range(3):
        buf[:] = r + k
        req.Start()
        req.Wait()
        assert (out == sum(rr + k for rr in range(r + 1))).all(), k
    req.Free()
    # AVG is no prefix reduction: a clear error on every rank, before anything is sent
    try:
        mine.team.scan(np.ones(3), op="avg")
    except ValueError as exc:
        assert "AVG" in str(exc)
    else:
        raise AssertionError("scan with AVG did not raise")


def w_case(n, r, count, dtype, mpitype):
    """Alltoallw buffers: block j of rank r's send holds r * 10 + j; blocks ``stride`` apart."""
    stride = count + 2  # gaps between blocks (displacements in bytes)
    send = np.full(n * stride, SENTINEL, dtype)
    for j in range(n):
        send[j * stride:j * stride + count] = r * 10 + j
    displs = [j * stride * np.dtype(dtype).itemsize for j in range(n)]
    return send, ([count] * n, displs), [mpitype] * n, stride


def check_alltoallw(comm, mine):
    n, r = comm.size, comm.rank
    ctx = pycoll.get_context()
    for dtype, mpitype in ((np.int32, MPI.INT), (np.float64, MPI.DOUBLE), (np.int8, MPI.SIGNED_CHAR)):
        for count in (0, 1, 5):
            send, layout, types, stride = w_case(n, r, count, dtype, mpitype)
            want, got = np.full(send.size, SENTINEL, dtype), np.full(send.size, SENTINEL, dtype)
            comm.Alltoallw((send, layout, types), (want, layout, types))
            engine(ctx, lambda: mine.Alltoallw((send, layout, types), (got, layout, types)))  # noqa: B023
            assert np.array_equal(got, want), ("Alltoallw", dtype, count)
            got.fill(SENTINEL)
            mine.Ialltoallw((send, *layout, types), (got, *layout, types)).Wait()  # the 4-item form
            assert np.array_equal(got, want), ("Ialltoallw", dtype, count)
            # in place: the receive buffer is the input
            inp = send.copy()
            engine(ctx, lambda: mine.Alltoallw(MPI.IN_PLACE, (inp, layout, types)))  # noqa: B023
            assert np.array_equal(inp[:count], want[:count]) and np.array_equal(
                inp.reshape(n, stride)[:, :count], want.reshape(n, stride)[:, :count]), ("in place", dtype)
    # persistent in place, refilled: each start sends what the buffer holds then
    send, layout, types, stride = w_case(n, r, 3, np.int32, MPI.INT)
    buf = send.copy()
    req = mine.Alltoallw_init(MPI.IN_PLACE, (buf, layout, types))
    for k in range(3):
        buf[:] = send + k
        req.Start()
        req.Wait()
        got = buf.reshape(n, stride)[:, :3]
        assert (got == np.array([[i * 10 + r + k] * 3 for i in range(n)])).all(), k
    req.Free()


def check_in_place(comm, mine):
    n, r = comm.size, comm.rank
    ctx = pycoll.get_context()
    # Reduce_scatter_block: the whole input in the receive buffer, the result at its start
    for cnt in (0, 1, 4):
        whole = np.arange(n * cnt, dtype=np.int64) * (r + 1)
        want, got = whole.copy(), whole.copy()
        comm.Reduce_scatter_block(MPI.IN_PLACE, want, MPI.SUM)
        engine(ctx, lambda: mine.Reduce_scatter_block(MPI.IN_PLACE, got, MPI.SUM))  # noqa: B023
        assert np.array_equal(got[:cnt], want[:cnt]) and np.array_equal(got[cnt:], whole[cnt:]), cnt
    counts = [k + 1 for k in range(n)]
    whole = np.arange(sum(counts), dtype=np.float64) + r
    want, got = whole.copy(), whole.copy()
    comm.Reduce_scatter(MPI.IN_PLACE, want, counts, MPI.MAX)
    engine(ctx, lambda: mine.Reduce_scatter(MPI.IN_PLACE, got, counts, MPI.MAX))
    assert np.array_equal(got[:counts[r]], want[:counts[r]]), "Reduce_scatter in place"
    # Alltoall and Alltoallv in place
    whole = np.arange(n * 3, dtype=np.int32) + 100 * r
    want, got = whole.copy(), whole.copy()
    comm.Alltoall(MPI.IN_PLACE, want)
    engine(ctx, lambda: mine.Alltoall(MPI.IN_PLACE, got))
    assert np.array_equal(got, want), "Alltoall in place"
    vcounts, vdispls = [2] * n, [4 * j for j in range(n)]
    whole = np.arange(4 * n, dtype=np.int32) + 100 * r
    want, got = whole.copy(), whole.copy()
    comm.Alltoallv(MPI.IN_PLACE, [want, (vcounts, vdispls), MPI.INT])
    engine(ctx, lambda: mine.Alltoallv(MPI.IN_PLACE, [got, (vcounts, vdispls), MPI.INT]))
    assert np.array_equal(got, want), "Alltoallv in place"
    # persistent in place, refilled between starts (a copy made at each start)
    buf = np.zeros(n * 2, np.int64)
    req = mine.Reduce_scatter_block_init(MPI.IN_PLACE, buf, MPI.SUM)
    for k in range(3):
        buf[:] = r + k
        req.Start()
        req.Wait()
        assert (buf[:2] == sum(rr + k for rr in range(n))).all() and (buf[2:] == r + k).all(), k
    req.Free()


def main():
    comm = MPI.COMM_WORLD
    mine = Comm(comm)
    check_prefix(comm, mine)
    check_alltoallw(comm, mine)
    check_in_place(comm, mine)
    comm.Barrier()


if __name__ == "__main__":
    run_rank(main)
