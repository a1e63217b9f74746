"""Two threads that post untagged collectives on one team at once: every rank raises (pycoll's rule
for threads, see docs/guide/team.md), on the shared segment and over MPI's point to point; a tag per
thread, or one thread after another, computes right (tests/procs/scripts/threads.py)."""

import pytest


@pytest.mark.parametrize("tls", ["shm,mpi", "mpi"])
def test_two_threads_untagged(mpirun, tls):
    mpirun(2, "tests/procs/scripts/threads.py", timeout=180, env={"PYCOLL_TLS": tls})
