"""The point-to-point block algorithms (tests/unit/test_algorithms_local.py) and the tree and
large-message algorithms (tests/unit/test_algorithms_tree_local.py) over MPI in real processes."""

import pytest


@pytest.mark.parametrize("n", [3, 4])
def test_algorithms_over_mpi(n, mpirun):
    mpirun(n, "tests/coll/scripts/p2p_algorithms.py", timeout=90, env={"PYCOLL_TLS": "mpi"})


@pytest.mark.parametrize("n", [3, 4])
def test_over_mpi(n, mpirun):
    mpirun(n, "tests/coll/scripts/tree_algorithms.py", timeout=120, env={"PYCOLL_TLS": "mpi"})
