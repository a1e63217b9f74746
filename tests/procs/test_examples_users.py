"""The user examples on 2 ranks under mpiexec: examples/mpi4py_dropin.py, team_api.py,
custom_schedule.py (its in-process part also runs in tests/unit/test_local.py; here it is
registered, selected by PYCOLL_TUNE and traced on MPI ranks), lowered_schedule.py (over UCX) and
scheduling_trace.py.

The examples print what a user reads, not ``RANK <r> OK``; so the launch runs this file on each
rank (the ``__main__`` part below), which runs the example and reports through tests/rank.py: a
rank whose example raised is named with its traceback, as for every launched script."""

import re
import runpy
import sys

import pytest

from tests.launch import ROOT, need_ucx

HERE = "tests/procs/test_examples_users.py"


def example(mpirun, name, *args, env=None):
    """Run examples/``name`` with ``args`` on 2 ranks; its output, without the ``RANK <r> OK``
    lines (which mpiexec may put in the middle of another rank's line)."""
    out = mpirun(2, HERE, f"examples/{name}", *args, timeout=60, env=env)
    return re.sub(r"RANK \d+ OK\n?", "", out)


def test_mpi4py_dropin(mpirun):
    out = example(mpirun, "mpi4py_dropin.py")
    assert "match numpy (comm is pycoll.mpi.Comm)" in out
    # two lines changed, and marked, from the plain mpi4py program
    lines = (ROOT / "examples" / "mpi4py_dropin.py").read_text().splitlines()
    marked = [line.split("  #")[0] for line in lines if "# pycoll:" in line]
    assert marked == ["import pycoll.mpi", "comm = pycoll.mpi.Comm(MPI.COMM_WORLD)"], marked


def test_team_api(mpirun):
    out = example(mpirun, "team_api.py")
    for what in ("blocking allreduce", "overlapped allreduce", "persistent allreduce x5",
                 "tagged allreduces in different orders", "allgatherv",
                 "bitwise AND of floats refused (ValueError)", "strided buffer refused (",
                 "mismatch caught (MismatchError)"):
        assert what in out, (what, out)


def test_custom_schedule_registered_tuned_traced(tmp_path, mpirun):
    out = example(mpirun, "custom_schedule.py", env={"PYCOLL_TRACE": str(tmp_path / "t.json")})
    assert "recursive-doubling allreduce on 4 in-process ranks matches numpy" in out  # written
    assert re.search(r"subtask +rd-step0 +8000 B", out), out  # its step, traced
    assert "the 8000 B allreduce ran rdsched (selected by PYCOLL_TUNE)" in out  # registered, selected
    assert "the 128 KiB one ['allreduce:shm@0']" in out  # past the rule: the default
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.rank0.json", "t.rank1.json"]


def test_lowered_schedule_runs_as_a_native_program_over_ucx(mpirun):
    """examples/lowered_schedule.py: a user's schedule of primitive tasks, lowered and checked in
    process, then on 2 UCX ranks run as a native program (rdprim) and as its schedule (rdprim_py),
    each result checked by the example."""
    need_ucx()
    out = example(mpirun, "lowered_schedule.py", "200", env={"PYCOLL_TLS": "ucx,mpi"})
    assert "rdprim lowers on 4 ranks, with the schedule's bits" in out, out
    assert "rdprim ran as UCXProgramTask, rdprim_py as Schedule" in out, out
    assert "8 B allreduce on 2 ranks over ucx: program" in out, out


def test_scheduling_trace_priorities_first(tmp_path, mpirun):
    pytest.importorskip("matplotlib")
    png = tmp_path / "timeline.png"
    out = example(mpirun, "scheduling_trace.py", "--png", str(png),
                  env={"PYCOLL_TRACE": str(tmp_path / "trace.json")})
    orders = dict(re.findall(r"(priority|fifo) run started: ((?:(?:bulk|urgent)\d ?)+)", out))
    assert set(orders) == {"priority", "fifo"}, out
    prio, fifo = orders["priority"].split(), orders["fifo"].split()
    posted = ["bulk0", "bulk1", "bulk2", "urgent0", "urgent1"]
    assert sorted(prio) == sorted(fifo) == sorted(posted), orders
    assert fifo == posted, orders  # all equal: in posting order
    # with priorities the urgent ones, posted last, start before the bulk still queued (bulk0,
    # posted first, started at once; bulk1 may have too, had bulk0 finished inside its post)
    assert max(prio.index("urgent0"), prio.index("urgent1")) < prio.index("bulk2"), orders
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (tmp_path / "merged.json").exists()


if __name__ == "__main__":  # one rank: python -u tests/procs/test_examples_users.py EXAMPLE [ARGS]
    from tests.rank import run_rank

    script = str(ROOT / sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]  # what the example's own argument parser sees
    run_rank(lambda: runpy.run_path(script, run_name="__main__"))
