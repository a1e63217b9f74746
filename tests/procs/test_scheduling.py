"""pycoll.scheduling on real ranks under mpiexec: readiness in different orders under a credit of
one partition, the auto-tuner agreed on every rank, the priority order in PYCOLL_TRACE files. In
process: tests/unit/test_scheduling.py."""

import pytest


@pytest.mark.parametrize("n,tls", [(3, "shm,mpi"), (4, "mpi")])
def test_ready_in_different_orders_on_ranks(n, tls, mpirun):
    """Tensors made ready in a different random order on each rank under credit of one partition."""
    mpirun(n, "tests/procs/scripts/scheduling.py", "orders", timeout=120, env={"PYCOLL_TLS": tls})


def test_tuning_changes_credit_and_partition_on_all_ranks_at_once(mpirun):
    out = mpirun(3, "tests/procs/scripts/scheduling.py", "tuning", timeout=120)
    assert "tuning log" in out


@pytest.mark.usefixtures("no_agreement_check")  # counts tasks and spans
def test_trace_shows_priority_order_and_partition_sizes(tmp_path, mpirun):
    path = tmp_path / "sched.json"
    mpirun(2, "tests/procs/scripts/scheduling.py", "trace", timeout=120, env={"PYCOLL_TRACE": str(path)})
    assert (tmp_path / "sched.rank0.json").exists() and (tmp_path / "sched.rank1.json").exists()
