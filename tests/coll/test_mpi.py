"""Allreduce over the MPI transport in real processes (mpiexec, oversubscribing the 2 cores)."""

import pytest


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_allreduce_quick(n, mpirun):
    mpirun(n, "tests/coll/scripts/allreduce_matrix.py", "quick", timeout=120)


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_matrix(n, mpirun):
    mpirun(n, "tests/coll/scripts/allreduce_matrix.py", "matrix", timeout=300)


@pytest.mark.parametrize("n", [3, 4])
def test_split_and_concurrent_teams(n, mpirun):
    mpirun(n, "tests/coll/scripts/allreduce_matrix.py", "split", timeout=120)


@pytest.mark.parametrize("n", [2, 4])
def test_tagged_different_orders_small_credit(n, mpirun):
    mpirun(n, "tests/coll/scripts/allreduce_matrix.py", "tagged", timeout=180)


@pytest.mark.parametrize("n", [1, 3])
def test_comm_lookalike(n, mpirun):
    mpirun(n, "tests/coll/scripts/comm_lookalike.py", timeout=120)


@pytest.mark.parametrize("n", [2, 3])
def test_comm_buffer_specifications_match_mpi4py(n, mpirun):
    """Every mpi4py buffer specification form (counts of block buffers per block, displacements,
    integer and strided v-counts) leaves what mpi4py's own communicator leaves, sentinels too."""
    mpirun(n, "tests/coll/scripts/comm_buffer_specs.py", timeout=120)


@pytest.mark.parametrize(("n", "tls"), [(2, None), (3, "mpi")])
def test_comm_buffer_objects_at_every_call(n, tls, mpirun):
    """Every buffer object mpi4py takes (bytearray, bytes, mmap, memoryview, array.array,
    MPI.buffer, torch), bare and in list specifications, blocking, non-blocking and persistent,
    at the first call and in the repeats' fast path: MPI's values while contents, counts and
    places change; a bytearray resizes and an mmap closes after a blocking call, not during a
    non-blocking one (as under mpi4py)."""
    mpirun(n, "tests/coll/scripts/comm_buffer_objects.py", timeout=180,
           env={"PYCOLL_TLS": tls} if tls else None)


@pytest.mark.parametrize(("n", "tls"), [(2, "shm,mpi"), (3, "mpi")])
def test_comm_rejected_calls_leave_it_usable(n, tls, mpirun):
    """A call the Comm rejects (a wrong count, a root out of range, a malformed
    buffer specification, mixed dtypes) raises on every rank and the next collective is right;
    long double and complex long double move as mpi4py moves them; their reductions, and ops
    pycoll has not (user-defined, MAXLOC), go to MPI."""
    mpirun(n, "tests/coll/scripts/comm_rejected.py", timeout=120, env={"PYCOLL_TLS": tls})


@pytest.mark.parametrize("mode", ["tagged", "untagged"])
@pytest.mark.parametrize("tls", ["mpi", "shm,mpi"])
def test_thousand_mixed_collectives_small_credit(mode, tls, mpirun):
    """1,000 collectives of every kind with random priorities on 4 processes under a credit of
    4 KiB: tagged ones posted in a different order on every rank, untagged ones in one order."""
    mpirun(4, "tests/coll/scripts/many_in_flight.py", mode, "1000", "4096", timeout=180,
           env={"PYCOLL_TLS": tls})


@pytest.mark.parametrize("n", [1, 3, 4])
def test_comm_scan_exscan_alltoallw_and_in_place_copies_match_mpi(n, mpirun):
    """Scan/Exscan (every op, dtype, count; in place; persistent), Alltoallw (both forms, gaps,
    in place, persistent in place refilled) and the in-place Alltoall(v)/Reduce_scatter(_block)
    through pycoll's engine, against mpi4py's own results."""
    mpirun(n, "tests/coll/scripts/comm_prefix_w.py", timeout=120)


@pytest.mark.parametrize("n", [1, 3])
def test_comm_constructors_stay_on_pycoll(n, mpirun):
    mpirun(n, "tests/coll/scripts/comm_constructors.py", timeout=120)


def test_a_timeout_off_the_segment_says_what_each_peer_does(mpirun):
    """Rank 0's collective #3 times out: rank 1 posted a tagged collective instead (its answer:
    what it posted and waits on), rank 2 sleeps outside pycoll (no answer in 0.5 s)."""
    mpirun(3, "tests/coll/scripts/timeout_peers.py", timeout=60, env={"PYCOLL_TLS": "mpi"})


def test_a_size_mismatch_no_check_saw_says_so_on_the_mpi_transport(mpirun):
    """An MPI truncation (a larger message than the receive) reads as what it means here: the
    ranks' calls differ in size, and PYCOLL_CHECK=all checks every call."""
    mpirun(2, "tests/coll/scripts/truncated.py", timeout=60, env={"PYCOLL_TLS": "mpi", "PYCOLL_CHECK": "off"})


def test_a_packed_marked_receive_keeps_nothing_of_the_callers_buffer(mpirun):
    mpirun(2, "tests/coll/scripts/packed_stage.py", timeout=120)
