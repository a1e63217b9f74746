"""BytePS push-sum-pull against numpy on workers with and without summation servers, under mpiexec:
sync for every float dtype, async (a slow worker does not hold the others back), push_pull as an
allreduce algorithm, under the scheduler and in the mpi4py look-alike. In process:
tests/unit/test_push_pull.py."""

import pytest


@pytest.mark.parametrize("n,k", [(2, 1), (3, 1), (4, 4)])  # (no servers: the allreduce-algorithm test)
def test_push_pull_sync_matches_numpy(n, k, mpirun):
    mpirun(n + k, "tests/procs/scripts/push_pull.py", "sync", timeout=180,
           env={"PYCOLL_NUM_SERVERS": str(k)})


@pytest.mark.parametrize("n,k", [(2, 1), (4, 4)])
def test_push_pull_async(n, k, mpirun):
    """Deltas added at once, current values pulled without waiting for a slow worker."""
    mpirun(n + k, "tests/procs/scripts/push_pull.py", "async", timeout=120,
           env={"PYCOLL_NUM_SERVERS": str(k)})


@pytest.mark.parametrize("n,k", [(3, 0), (2, 1)])
def test_push_pull_as_allreduce_algorithm_scheduler_and_comm(n, k, mpirun):
    mpirun(n + k, "tests/procs/scripts/push_pull.py", "api", timeout=120, env={"PYCOLL_NUM_SERVERS": str(k)})
