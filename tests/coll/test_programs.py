"""Lowered programs run by team.run_program in real processes (mpiexec), over MPI and UCX."""

import pytest

from tests.launch import need_ucx


@pytest.mark.parametrize("n", [2, 3, 4])
def test_programs_over_mpi(n, mpirun):
    mpirun(n, "tests/coll/scripts/programs.py", timeout=240)


def test_programs_over_ucx(mpirun):
    need_ucx()
    mpirun(3, "tests/coll/scripts/programs.py", timeout=240, env={"PYCOLL_TLS": "ucx,mpi"})
