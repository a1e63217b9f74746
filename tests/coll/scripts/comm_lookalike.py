"""Run under mpiexec by tests/coll/test_mpi.py: pycoll.mpi.Comm accepts what mpi4py accepts."""


import numpy as np
from mpi4py import MPI

from pycoll.mpi import Comm
from tests.rank import run_rank


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
    check_v_and_persistent(world, comm, n, r)


def check_v_and_persistent(world, comm, n, r):
    """The v-collectives with mpi4py's vector buffer specs, and the persistent forms, against
    mpi4py's own."""
    counts = [(i % 3) + 1 for i in range(n)]
    displs = [sum(counts) + 2 - sum(counts[:i + 1]) for i in range(n)]  # reversed, with a gap
    room = sum(counts) + 2
    mine = np.arange(counts[r], dtype=np.float64) + 10 * r
    got, ref = np.full(room, -1.0), np.full(room, -1.0)
    comm.Allgatherv(mine, [got, counts, displs, MPI.DOUBLE])
    world.Allgatherv(mine, [ref, counts, displs, MPI.DOUBLE])
    assert np.array_equal(got, ref), (got, ref)
    got2 = ref.copy()
    got2[displs[r]:displs[r] + counts[r]] = mine
    comm.Iallgatherv(MPI.IN_PLACE, [got2, (counts, displs), MPI.DOUBLE]).Wait()
    assert np.array_equal(got2, ref)
    whole = np.arange(float(sum(counts))) * (r + 1)
    rs, ref = np.zeros(counts[r]), np.zeros(counts[r])
    comm.Reduce_scatter(whole, rs, counts, op=MPI.SUM)
    world.Reduce_scatter(whole, ref, counts, op=MPI.SUM)
    assert np.array_equal(rs, ref)
    rs2 = np.zeros(counts[r])
    comm.Reduce_scatter(whole, rs2, op=MPI.MAX)  # counts from every rank's recvbuf
    world.Reduce_scatter(whole, ref, op=MPI.MAX)
    assert np.array_equal(rs2, ref)
    scounts = [(r + j) % 3 for j in range(n)]
    rcounts = [(i + r) % 3 for i in range(n)]
    src = np.arange(float(sum(scounts))) + 100 * r
    a2a, ref = np.zeros(sum(rcounts)), np.zeros(sum(rcounts))
    comm.Alltoallv([src, scounts], [a2a, rcounts])
    world.Alltoallv([src, scounts], [ref, rcounts])
    assert np.array_equal(a2a, ref)
    root = n // 2
    g, ref = np.full(room, -1.0), np.full(room, -1.0)
    comm.Gatherv(mine, [g, counts, displs, MPI.DOUBLE] if r == root else None, root=root)
    world.Gatherv(mine, [ref, counts, displs, MPI.DOUBLE] if r == root else None, root=root)
    assert r != root or np.array_equal(g, ref)
    sv, ref = np.zeros(counts[r]), np.zeros(counts[r])
    source = np.arange(float(room))
    comm.Scatterv([source, counts, displs, MPI.DOUBLE] if r == root else None, sv, root=root)
    world.Scatterv([source, counts, displs, MPI.DOUBLE] if r == root else None, ref, root=root)
    assert np.array_equal(sv, ref)
    # persistent: built once, started three times with refilled buffers
    buf, out = np.zeros(4), np.zeros(4)
    p_ar = comm.Allreduce_init(buf, out, op=MPI.SUM)
    p_bc = comm.Bcast_init(bc := np.zeros(3), root=n - 1)
    p_ag = comm.Allgatherv_init(mine, [got, counts, displs, MPI.DOUBLE])
    p_ba = comm.Barrier_init()
    for it in range(3):
        buf[:] = r + it
        bc[:] = it if r == n - 1 else -1
        got[:] = -1
        reqs = [p_ar, p_bc, p_ag, p_ba]
        Prequest = type(p_ar)
        Prequest.Startall(reqs)
        for q in reqs:
            q.Wait()
        assert (out == sum(range(n)) + n * it).all()
        assert (bc == it).all()
        ref = np.full(room, -1.0)
        world.Allgatherv(mine, [ref, counts, displs, MPI.DOUBLE])
        assert np.array_equal(got, ref)
    for q in (p_ar, p_bc, p_ag, p_ba):
        q.Free()
    check_waitall(world, comm, n, r)
    check_counts_changed_in_place(world, n, r)


def check_waitall(world, comm, n, r):
    """``Request.Waitall``/``Testall`` and ``Prequest.Startall``/``Waitall`` of the Comm's classes
    take pycoll's requests and mpi4py's in one list (mpi4py's own refuse pycoll's); a point-to-point
    exchange large enough to need the receiver's progress (rendezvous) is in it, so a wait that
    left MPI unprogressed while it waited on pycoll would hang."""
    big = 1 << 20
    right, left = (r + 1) % n, (r - 1) % n
    send, recv = np.full(big, r, np.uint8), np.zeros(big, np.uint8)
    x, y, z = np.full(3, r + 1.0), np.zeros(3), np.full(2, float(r))
    reqs = [world.Isend(send, dest=right, tag=7), comm.Iallreduce(x, y, op=MPI.SUM),
            world.Irecv(recv, source=left, tag=7), comm.Ibcast(z, root=n - 1)]
    Request = type(reqs[1])
    assert Request.Waitall(reqs) is True
    assert Request.Testall(reqs) is True
    assert (recv == left).all() and (y == n * (n + 1) / 2).all() and (z == n - 1).all()
    # mpi4py's own Waitall takes its own requests only: a clear error, not a return before the work
    refused = None
    try:
        MPI.Request.Waitall(reqs)
    except TypeError as exc:
        refused = exc
    assert refused is not None, "MPI.Request.Waitall took pycoll's requests"
    mine, theirs = np.zeros(4), np.zeros(4)
    pers = [comm.Allreduce_init(np.ones(4), mine, op=MPI.SUM),
            world.Allreduce_init(np.ones(4), theirs, op=MPI.SUM)]
    Prequest = type(pers[0])
    for _ in range(2):
        mine[:] = theirs[:] = 0
        Prequest.Startall(pers)
        Prequest.Waitall(pers)
        assert (mine == n).all() and (theirs == n).all()
    for q in pers:
        q.Free()



def check_counts_changed_in_place(world, n, r):
    """``Reduce_scatter``'s recvcounts as a numpy array, changed in place after repeated calls:
    checked again (as a list is), not run with the counts the calls before gave."""
    if n == 1:
        return
    counts = np.arange(1, n + 1)
    whole = np.ones(int(counts.sum()))
    out = np.zeros(counts[r])
    comm = Comm(world)
    for _ in range(3):
        comm.Reduce_scatter(whole, out, counts, op=MPI.SUM)
    assert (out == n).all()
    counts[:] = counts[::-1].copy()  # (rank r's count changes unless it is the middle one)
    raised = None
    try:
        comm.Reduce_scatter(whole, out, counts, op=MPI.SUM)
    except (ValueError, MPI.Exception) as exc:
        raised = exc
    assert raised is not None, f"rank {r}: Reduce_scatter ran unchecked with counts {counts.tolist()}"


if __name__ == "__main__":
    run_rank(main)
