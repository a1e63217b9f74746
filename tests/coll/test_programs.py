"""Lowered programs run by team.run_program in real processes (mpiexec), over MPI, UCX and one
host's single-copy point-to-point path (a team over a TCP store: its executor, native/exec_shm.c)."""

import pytest

from tests.launch import need_ucx


@pytest.mark.parametrize("n", [2, 3, 4])
def test_programs_over_mpi(n, mpirun):
    mpirun(n, "tests/coll/scripts/programs.py", timeout=240)


def test_programs_over_ucx(mpirun):
    need_ucx()
    mpirun(3, "tests/coll/scripts/programs.py", timeout=240, env={"PYCOLL_TLS": "ucx,mpi"})


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_programs_over_shared_memory(n, mpirun):
    mpirun(n, "tests/coll/scripts/programs.py", "match", "shm", timeout=240)


@pytest.mark.parametrize("tls", ["mpi", "ucx,mpi", "shm"])
def test_a_program_that_times_out_names_its_wait(tls, mpirun):
    if tls.startswith("ucx"):
        need_ucx()
    args = ("timeout", "shm") if tls == "shm" else ("timeout",)
    out = mpirun(3, "tests/coll/scripts/programs.py", *args, timeout=120, env={"PYCOLL_TLS": tls})
    assert "rank 0:" in out, out
