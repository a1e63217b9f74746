"""PYCOLL_TRACE on two ranks under mpiexec, merged by ``pycoll trace merge`` and drawn by ``pycoll
trace plot``. In one process: tests/unit/test_trace.py."""

import json

import pytest

from tests.launch import pycoll_cli
from tests.unit.test_trace import assert_lanes_do_not_overlap


def cli(*args, cwd):
    """Run ``pycoll ARGS`` in ``cwd``; assert that it exits 0; its stdout."""
    rc, out, err = pycoll_cli(*args, timeout=120, cwd=cwd)
    assert rc == 0, out + err
    return out


def test_two_ranks_merge_and_plot(tmp_path, mpirun):
    pytest.importorskip("matplotlib")
    mpirun(2, "tests/procs/scripts/trace_steps.py", timeout=60,
           env={"PYCOLL_TRACE": str(tmp_path / "t.json")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.rank0.json", "t.rank1.json"]
    out = cli("trace", "merge", "t.json", "-o", "merged.json", cwd=tmp_path)
    assert "merged 2 trace files" in out
    doc = json.loads((tmp_path / "merged.json").read_text())
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    for pid in (0, 1):
        mine = [e for e in doc["traceEvents"] if e.get("pid") == pid and e.get("ph") == "X"]
        assert {e["cat"] for e in mine} >= {"comm", "queue", "forward", "backward", "compute"}
        assert_lanes_do_not_overlap([e for e in mine if e["cat"] in ("comm", "queue")])
    # clocks line up: the ranks' step marks are close (the allreduces synchronize them)
    marks = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "step":
            marks.setdefault(e["args"]["step"], {})[e["pid"]] = e["ts"]
    assert sorted(marks) == [0, 1, 2, 3, 4]
    assert all(abs(m[0] - m[1]) < 500_000 for m in marks.values()), marks
    out = cli("trace", "plot", "merged.json", "-o", "step.png", "--step", "2", cwd=tmp_path)
    assert "step 2" in out and "2 rank" in out
    png = (tmp_path / "step.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # per-rank files (a glob) directly, default step, subtasks
    cli("trace", "plot", "t.rank*.json", "-o", "all.png", "--subtasks", cwd=tmp_path)
    assert (tmp_path / "all.png").read_bytes()[:4] == b"\x89PNG"
    # the whole trace though steps are marked
    out = cli("trace", "plot", "merged.json", "-o", "whole.png", "--all", cwd=tmp_path)
    assert "whole trace" in out and (tmp_path / "whole.png").read_bytes()[:4] == b"\x89PNG"
