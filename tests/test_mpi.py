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
