"""Allreduce over the MPI transport in real processes (mpiexec, oversubscribing the 2 cores)."""

import pytest

from tests.mpirun import run_ranks


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_allreduce_quick(n):
    run_ranks(n, "tests/mpi/allreduce_matrix.py", "quick", timeout=120)


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_matrix(n):
    run_ranks(n, "tests/mpi/allreduce_matrix.py", "matrix", timeout=300)


@pytest.mark.parametrize("n", [3, 4])
def test_split_and_concurrent_teams(n):
    run_ranks(n, "tests/mpi/allreduce_matrix.py", "split", timeout=120)


@pytest.mark.parametrize("n", [2, 4])
def test_tagged_different_orders_small_credit(n):
    run_ranks(n, "tests/mpi/allreduce_matrix.py", "tagged", timeout=180)


@pytest.mark.parametrize("n", [1, 3])
def test_comm_lookalike(n):
    run_ranks(n, "tests/mpi/comm_lookalike.py", timeout=120)


@pytest.mark.parametrize("mode", ["tagged", "untagged"])
@pytest.mark.parametrize("tls", ["mpi", "shm,mpi"])
def test_thousand_mixed_collectives_small_credit(mode, tls):
    """1,000 collectives of every kind with random priorities on 4 processes under a credit of
    4 KiB: tagged ones posted in a different order on every rank, untagged ones in one order."""
    run_ranks(4, "tests/mpi/many_in_flight.py", mode, "1000", "4096", timeout=180, env={"PYCOLL_TLS": tls})
