"""Run under mpiexec by tests/coll/test_mpi.py: every mpi4py buffer specification form, given to
``pycoll.mpi.Comm`` and to mpi4py's own communicator with the same inputs, leaves the same values
in every output buffer (sentinels included: nothing written outside what MPI writes)."""

import numpy as np
from mpi4py import MPI

from pycoll.mpi import Comm
from tests.rank import run_rank

SENTINEL = -7
M = 3  # elements of one block


def simple_forms(buf, count, displ):
    """mpi4py's non-vector forms of ``buf`` (int32) holding ``count`` elements (or blocks of them)
    at ``displ``."""
    yield "[buf, count]", [buf, count]
    yield "[buf, (count, displ)]", [buf, (count, displ)]
    yield "[buf, count, type]", [buf, count, MPI.INT]
    yield "[buf, (count, displ), type]", [buf, (count, displ), MPI.INT]
    yield "[buf, [count, displ], type]", [buf, [count, displ], MPI.INT]
    yield "[buf, count, displ, type]", [buf, count, displ, MPI.INT]


def vector_forms(buf, counts, displs, n):
    """mpi4py's vector forms of ``buf`` (int32)."""
    yield "[buf, counts, displs, type]", [buf, counts, displs, MPI.INT]
    yield "[buf, (counts, displs), type]", [buf, (counts, displs), MPI.INT]
    yield "[buf, (counts, displs)]", [buf, (counts, displs)]
    yield "[buf, counts, type]", [buf, list(counts), MPI.INT]
    yield "[buf, (int, int), type]", [buf, (M, M + 2), MPI.INT]          # strided blocks
    yield "[buf, int, type]", [buf, M, MPI.INT]


def fresh(size):
    return np.full(size, SENTINEL, np.int32)


def same(name, form, got, want):
    assert np.array_equal(got, want), f"{name} with {form}: pycoll {got.tolist()} mpi4py {want.tolist()}"


def check_simple(world, comm, n, r):
    """Block collectives: a count given with a buffer of one block per rank is one block's."""
    pad = 2  # elements before (the displacement) and after what the call uses
    mine = np.arange(M, dtype=np.int32) + 10 * r
    blocks = np.arange(n * M, dtype=np.int32) + 100 * r
    cases = [
        ("Allgather", lambda c, rb: c.Allgather(mine, rb), n * M),
        ("Alltoall", lambda c, rb: c.Alltoall(blocks, rb), n * M),
        ("Gather", lambda c, rb: c.Gather(mine, rb, root=n - 1), n * M),
        ("Allreduce", lambda c, rb: c.Allreduce(mine, rb, op=MPI.SUM), M),
        ("Reduce", lambda c, rb: c.Reduce(mine, rb, op=MPI.MAX, root=0), M),
        ("Scatter", lambda c, rb: c.Scatter(blocks, rb, root=0), M),
    ]
    for name, call, used in cases:
        count = M if used == n * M else used
        for form, _ in simple_forms(fresh(1), count, pad):
            outs = []
            for c in (world, comm):
                rb = fresh(used + 2 * pad)
                spec = dict(simple_forms(rb, count, pad))[form]
                call(c, spec)
                outs.append(rb)
            same(name, form, outs[1], outs[0])
    # send side: Alltoall's and Scatter's counts are per block too
    for form, _ in simple_forms(fresh(1), M, 1):
        outs = []
        for c in (world, comm):
            sb = np.concatenate([[SENTINEL], blocks, [SENTINEL, SENTINEL]]).astype(np.int32)
            rb = fresh(n * M)
            c.Alltoall(dict(simple_forms(sb, M, 1))[form], rb)
            rs = fresh(M)
            c.Scatter(dict(simple_forms(sb, M, 1))[form], rs, root=n - 1)
            outs.append(np.concatenate([rb, rs]))
        same("Alltoall/Scatter send", form, outs[1], outs[0])
    # reduce-scatters: Reduce_scatter_block's send count is one block's, Reduce_scatter's the whole
    # (the sum of its counts), in place too; uneven counts, so the two readings differ
    counts = [M + i for i in range(n)]
    total = sum(counts)
    for form, _ in simple_forms(fresh(1), M, 1):
        outs = []
        for c in (world, comm):
            sb = np.concatenate([[SENTINEL], blocks, [SENTINEL]]).astype(np.int32)
            rb = fresh(M)
            c.Reduce_scatter_block(dict(simple_forms(sb, M, 1))[form], rb, op=MPI.SUM)
            vs = np.concatenate([[SENTINEL], np.arange(total) + r, [SENTINEL]]).astype(np.int32)
            rv = fresh(counts[r])
            c.Reduce_scatter(dict(simple_forms(vs, total, 1))[form], rv, counts, op=MPI.SUM)
            vi = np.concatenate([[SENTINEL], np.arange(total) + r, [SENTINEL]]).astype(np.int32)
            c.Reduce_scatter(MPI.IN_PLACE, dict(simple_forms(vi, total, 1))[form], counts, op=MPI.SUM)
            outs.append(np.concatenate([rb, rv, vi[1:1 + counts[r]]]))
        same("Reduce_scatter(_block)", form, outs[1], outs[0])
    # Fortran-ordered arrays (and transposed views) are contiguous: taken in memory order, as MPI
    outs = []
    for c in (world, comm):
        f = np.asfortranarray(np.arange(2 * M, dtype=np.int32).reshape(2, M) + 10 * r)
        fs = np.full((2, M), SENTINEL, np.int32, order="F")
        c.Allreduce(f, fs, op=MPI.SUM)
        fg = np.full((M, 2 * n), SENTINEL, np.int32).T  # (a transposed view of a C array)
        c.Allgather([f, MPI.INT], fg)
        outs.append(np.concatenate([fs.ravel(order="K"), fg.ravel(order="K")]))
    same("Allreduce/Allgather", "Fortran order", outs[1], outs[0])
    # Bcast with a count and displacement: only that part moves
    for form, _ in simple_forms(fresh(1), M, 2):
        outs = []
        for c in (world, comm):
            b = np.arange(M + 4, dtype=np.int32) if r == 0 else fresh(M + 4)
            c.Bcast(dict(simple_forms(b, M, 2))[form], root=0)
            outs.append(b)
        same("Bcast", form, outs[1], outs[0])


def check_vector(world, comm, n, r):
    """Vector collectives: every counts/displacements form, strided and integer ones included."""
    counts = [M] * n
    displs = [i * (M + 2) for i in range(n)]
    size = n * (M + 2)
    mine = np.arange(M, dtype=np.int32) + 10 * r
    whole = np.arange(size, dtype=np.int32) + 100 * r
    for form, _ in vector_forms(fresh(1), counts, displs, n):
        contiguous = form in ("[buf, counts, type]", "[buf, int, type]")
        outs = []
        for c in (world, comm):
            got = []
            rb = fresh(size)
            c.Allgatherv(mine, dict(vector_forms(rb, counts, displs, n))[form])
            got.append(rb)
            rb = fresh(size)
            c.Gatherv(mine, dict(vector_forms(rb, counts, displs, n))[form], root=0)
            got.append(rb)
            rs = fresh(M)
            c.Scatterv(dict(vector_forms(whole, counts, displs, n))[form], rs, root=n - 1)
            got.append(rs)
            rb = fresh(size)
            c.Alltoallv(dict(vector_forms(whole, counts, displs, n))[form],
                        dict(vector_forms(rb, counts, displs, n))[form])
            got.append(rb)
            outs.append(np.concatenate(got))
        assert contiguous or (outs[0] == SENTINEL).any()  # the gaps stayed untouched
        same("Allgatherv/Gatherv/Scatterv/Alltoallv", form, outs[1], outs[0])
    # no counts: the buffer split into n blocks as evenly as it goes
    outs = []
    for c in (world, comm):
        rb = fresh(n * M)
        c.Alltoallv([whole[:n * M], MPI.INT], [rb, MPI.INT])
        outs.append(rb)
    same("Alltoallv", "[buf, type]", outs[1], outs[0])


def main():
    world = MPI.COMM_WORLD
    comm = Comm(world)
    n, r = world.size, world.rank
    check_simple(world, comm, n, r)
    check_vector(world, comm, n, r)
    comm.team.close()


if __name__ == "__main__":
    run_rank(main)
