"""PYCOLL_TRACE on two ranks under mpiexec, merged by ``pycoll trace merge`` and drawn by ``pycoll
trace plot``. In one process: tests/unit/test_trace.py."""

import json

import pytest

from tests.launch import need_ucx, pycoll_cli
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


@pytest.mark.parametrize("kind", ["shm", "ucx", "mpi"])
def test_a_programs_instructions_show_with_a_setting(kind, tmp_path, mpirun):
    """PYCOLL_TRACE_INSTRUCTIONS=1: each call's instructions (rd on 2 ranks: send, recv, reduce)
    are subtask spans inside the collective's own span, with their peer and bytes: native programs
    (over shared memory, UCX; calls the engine polled and calls the express lane ran alike) and a
    program run in Python (over MPI)."""
    env = {"PYCOLL_TRACE": str(tmp_path / "t.json"), "PYCOLL_TRACE_INSTRUCTIONS": "1"}
    if kind == "ucx":
        need_ucx()
        env["PYCOLL_TLS"] = "ucx,mpi"
    mpirun(2, "tests/procs/scripts/trace_program.py", kind, timeout=60, env=env)
    events = json.loads((tmp_path / "t.rank0.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    ours = "allreduce:rd@0"  # (the collective's name: [native] follows where it ran natively)
    parent = ours if kind == "mpi" else f"{ours}[native]"  # (not the tasks of a program's recording)
    instrs = [e for e in spans if e["cat"] == "subtask" and e["args"].get("parent") == parent]
    kinds = {}
    for e in instrs:
        kinds.setdefault(e["name"], []).append(e)
    assert {"send 0", "recv 1", "reduce 2"} <= set(kinds), sorted(kinds)
    assert len(kinds["recv 1"]) == 12, len(kinds["recv 1"])  # (every call: express-lane runs too)
    assert all(e["args"]["peer"] == 1 and e["args"]["nbytes"] == 400 for e in kinds["recv 1"])
    # each recv inside a native collective's span (those the engine ran) or right before its reduce
    colls = [e for e in spans if e["cat"] == "comm" and e["name"].startswith(ours)]
    assert colls, sorted({e["name"] for e in spans})
    inside = [r for r in kinds["recv 1"]
              if any(c["ts"] - 1 <= r["ts"] and r["ts"] + r["dur"] <= c["ts"] + c["dur"] + 1 for c in colls)]
    assert inside, (kinds["recv 1"][:2], colls[:2])
    by_ts = sorted(kinds["recv 1"], key=lambda e: e["ts"]), sorted(kinds["reduce 2"], key=lambda e: e["ts"])
    for r, red in zip(*by_ts):
        assert r["ts"] + r["dur"] <= red["ts"] + 1, (r, red)  # (the reduction waits for the message)
