"""Lowered programs run by team.run_program in real processes (mpiexec), over MPI and UCX."""

import pytest

from tests.launch import need_ucx


@pytest.mark.parametrize("n", [2, 3, 4])
def test_programs_over_mpi(n, mpirun):
    mpirun(n, "tests/coll/scripts/programs.py", timeout=240)


def test_programs_over_ucx(mpirun):
    need_ucx()
    mpirun(3, "tests/coll/scripts/programs.py", timeout=240, env={"PYCOLL_TLS": "ucx,mpi"})


@pytest.mark.parametrize("tls", ["mpi", "ucx,mpi"])
def test_a_program_that_times_out_names_its_wait(tls, mpirun):
    if tls.startswith("ucx"):
        need_ucx()
    out = mpirun(3, "tests/coll/scripts/programs.py", "timeout", timeout=120, env={"PYCOLL_TLS": tls})
    assert "rank 0:" in out, out
