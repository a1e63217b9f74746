"""Closed means closed: a call on a closed team or a freed ``pycoll.mpi.Comm`` raises
``pycoll.ClosedError`` before anything is sent, on the shared segment and over MPI's point to
point (tests/procs/scripts/closed.py)."""

import pytest


@pytest.mark.parametrize("tls", ["shm,mpi", "mpi"])
def test_calls_after_close_are_refused(mpirun, tls):
    mpirun(2, "tests/procs/scripts/closed.py", timeout=120, env={"PYCOLL_TLS": tls})
