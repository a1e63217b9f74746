"""The short path of small collectives on real ranks sharing a segment (under mpiexec): persistent
and repeated collectives with refilled buffers, tagged collectives in per-rank orders under credit
mixed with untagged short-path ones, calls repeated with the same arguments (the express lane),
and a timeout when the peer never calls. In one process:
tests/unit/test_lean_path.py."""

import pytest

pytest.importorskip("pycoll.native", reason="the native module is not built")


@pytest.mark.parametrize("n", [2, 3])
def test_persistent_and_repeated_small_collectives_with_refilled_buffers(n, mpirun):
    mpirun(n, "tests/procs/scripts/lean_path.py", "persistent", timeout=120)


def test_tagged_in_per_rank_orders_mixed_with_short_path_untagged(mpirun):
    mpirun(2, "tests/procs/scripts/lean_path.py", "mixed", timeout=120)


def test_segment_collective_whose_peer_never_calls_times_out(mpirun):
    out = mpirun(2, "tests/procs/scripts/lean_path.py", "timeout", timeout=120)
    assert "timed out after" in out and "waiting on:" in out


#: The segment, and MPI's point to point (where a repeat is a step task's express run).
TLS = [pytest.param({}, id="segment"), pytest.param({"PYCOLL_TLS": "mpi"}, id="mpi")]


@pytest.mark.parametrize("env", TLS)
@pytest.mark.parametrize("n", [2, 3])
def test_repeated_calls_run_as_persistent_collectives_in_the_express_lane(n, env, mpirun):
    mpirun(n, "tests/procs/scripts/lean_path.py", "repeated", timeout=120, env=env)


@pytest.mark.parametrize("env", TLS)
def test_express_lane_repeat_whose_peer_never_calls_times_out(env, mpirun):
    out = mpirun(2, "tests/procs/scripts/lean_path.py", "repeat-timeout", timeout=120, env=env)
    assert "timed out after" in out and "waiting on:" in out


@pytest.mark.parametrize("env", TLS)
def test_a_mismatch_in_the_express_lane_raises_on_both_ranks(env, mpirun):
    out = mpirun(2, "tests/procs/scripts/lean_path.py", "lane-mismatch", timeout=120, env=env)
    assert "lane mismatch on rank 0:" in out and "lane mismatch on rank 1:" in out, out


def test_a_collective_that_owes_an_earlier_gathers_check_times_out_naming_it(mpirun):
    """A gather's ranks that went on without its root (which never calls) owe the check of its call:
    their next collective that checks signatures waits for it and times out saying so."""
    out = mpirun(3, "tests/procs/scripts/lean_path.py", "owed-timeout", timeout=120)
    assert "timed out waiting for the owed check" in out
