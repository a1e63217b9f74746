"""PYCOLL_TRACE: per-rank Chrome/Perfetto timelines in one process. Two ranks, ``pycoll trace merge``
and ``pycoll trace plot``: tests/procs/test_trace.py."""

import json
import os
import sys

import numpy as np
import pytest

import pycoll
from pycoll import Context, Event, trace
from pycoll.tasks import CopyTask
from pycoll.trace import rank_path
from tests.conftest import Manual

# (they count messages, bytes or spans, or look inside a request's task: see the fixture)
pytestmark = pytest.mark.usefixtures("no_agreement_check")


LAUNCHER_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK")


@pytest.fixture
def traced(tmp_path, monkeypatch):
    """PYCOLL_TRACE pointed at tmp_path, a fresh process tracer; the trace is read back by calling
    the returned function (which flushes)."""
    monkeypatch.setenv("PYCOLL_TRACE", str(tmp_path / "trace.json"))
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    trace.reset()

    def read():
        path = trace.flush()
        assert path == str(tmp_path / f"trace.rank{os.getpid()}.json")
        with open(path) as f:
            return json.load(f)

    yield read
    trace.reset()


def spans(doc, cat):
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == cat]


def assert_lanes_do_not_overlap(events):
    by_tid = {}
    for e in events:
        by_tid.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for lane in by_tid.values():
        lane.sort()
        for (_, end), (start, _) in zip(lane, lane[1:]):
            assert start >= end, lane


def test_tracing_off_costs_nothing(monkeypatch):
    monkeypatch.delenv("PYCOLL_TRACE", raising=False)
    trace.reset()
    assert trace.tracer() is None
    assert Context().on_start is None
    assert trace.flush() is None


def test_rank_file_names():
    assert rank_path("trace.json", 0) == "trace.rank0.json"
    assert rank_path("/tmp/x/t.json", 3) == "/tmp/x/t.rank3.json"
    assert rank_path("out/{rank}/t.json", 5) == "out/5/t.json"
    assert rank_path("trace", 2) == "trace.rank2"


def test_queue_waits_and_comm_spans_of_prioritized_tagged_allreduces(traced):
    ctx = Context(credit_bytes=4096, partition_bytes=0, timeout=60)
    assert ctx.on_start is not None
    tr = trace.tracer()
    teams = pycoll.local_teams(2, ctx)
    tr.step(0)
    reqs = []
    with tr.span("backward", "backward", layer="all"):
        for r, team in enumerate(teams):
            for k in (range(6) if r == 0 else reversed(range(6))):  # ranks post in different orders
                buf = np.full(1024, float(k + r), np.float32)  # 4096 B: one at a time fits the credit
                reqs.append(team.allreduce(buf, tag=f"grad{k}", priority=k))
                with tr.span("inner", "compute"):
                    pass
    pycoll.wait_all(reqs)
    tr.step(1)
    tr.instant("done", n=12)
    doc = traced()

    comm, queue = spans(doc, "comm"), spans(doc, "queue")
    assert len(comm) == 12 and len(queue) == 12
    for e in comm:
        a = e["args"]
        assert a["name"] == e["name"] and a["name"].startswith("allreduce:") and a["outcome"] == "completed"
        assert (a["nbytes"], a["credit"], a["credit_limit"]) == (4096, 4096, 4096)
        assert 0 <= a["priority"] < 6 and a["in_flight"] >= 0 and e["dur"] > 0
        assert (a["tag"], a["tag_use"]) == (repr(f"grad{a['priority']}"), 0)  # the user's tag
    # a pooled task reused untagged, and a tag's second use, say so
    tr.step(2)
    bufs = [np.ones(1024, np.float32) for _ in teams]
    pycoll.wait_all([t.allreduce(b) for t, b in zip(teams, bufs)])
    pycoll.wait_all([t.allreduce(b, tag="grad0") for t, b in zip(teams, bufs)])
    late = [e for e in spans(traced(), "comm") if e["ts"] > max(c["ts"] for c in comm)]
    assert sorted(str(e["args"].get("tag_use")) for e in late) == ["1", "1", "None", "None"], late
    assert sorted(e["args"]["priority"] for e in comm) == sorted(list(range(6)) * 2)
    assert sorted((e["name"], e["args"]["priority"]) for e in comm) == sorted(
        (e["name"], e["args"]["priority"]) for e in queue)
    # the first collective posted starts at once; the others waited for credit
    starts = sorted(e["args"]["start"] for e in comm)
    assert starts.count("submit") == 1, starts
    held = [e for e in queue if e["args"]["start"] != "submit"]
    assert len(held) == 11 and all(e["dur"] > 0 and e["args"]["wait_us"] > 0 for e in held)
    # each wait ends where its communication starts
    for q in queue:
        match = [c for c in comm if c["args"]["priority"] == q["args"]["priority"] and c["name"] == q["name"]]
        assert any(abs(c["ts"] - (q["ts"] + q["dur"])) < 1.0 for c in match)
    assert_lanes_do_not_overlap(comm)
    assert_lanes_do_not_overlap(queue)
    # lanes are named; the program's spans nest in its thread's lane
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {names[e["tid"]].split()[0] for e in comm} == {"comm"}
    assert {names[e["tid"]].split()[0] for e in queue} == {"queue"}
    (back,) = spans(doc, "backward")
    inner = spans(doc, "compute")
    assert len(inner) == 12 and back["args"] == {"layer": "all"}
    end = back["ts"] + back["dur"]
    assert all(e["tid"] == back["tid"] and back["ts"] <= e["ts"] <= e["ts"] + e["dur"] <= end for e in inner)
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "step"]
    assert [e["args"]["step"] for e in steps] == [0, 1] and all(e["ph"] == "i" for e in steps)
    assert any(e.get("name") == "done" and e["args"] == {"n": 12} for e in doc["traceEvents"])
    other = doc["otherData"]
    assert other["rank"] == os.getpid() and other["rank_source"] == "pid"
    # wall-clock microseconds
    import time

    assert abs(back["ts"] / 1e6 - time.time()) < 60


def test_overlapping_spans_of_one_thread_get_separate_lanes(traced):
    import time

    tr = trace.tracer()
    t = time.monotonic()
    tr.complete("a", "forward", t, t + 0.002)
    tr.complete("b", "backward", t + 0.001, t + 0.003)  # overlaps a without nesting
    tr.complete("c", "forward", t + 0.0005, t + 0.001)  # nests in a
    tr.complete("update w", "update", t, t + 0.001, name="w", step=3)  # a "name" arg is an arg
    doc = traced()
    by = {e["name"]: e for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert by["a"]["tid"] == by["c"]["tid"] != by["b"]["tid"]
    assert by["b"]["dur"] == pytest.approx(2000, abs=0.01)
    assert by["update w"]["args"] == {"name": "w", "step": 3} and by["update w"]["cat"] == "update"


def test_partitioned_task_failures_and_reposted_tasks(traced):
    ctx = Context(credit_bytes=1 << 20, partition_bytes=1 << 20, timeout=0)
    src = np.ones(4 << 20, np.uint8)
    dst = np.zeros_like(src)
    ctx.submit(CopyTask(dst, src, name="big", priority=3)).wait()

    class Boom(Manual):
        def post(self):
            raise RuntimeError("boom")

    req = ctx.submit(Boom("boom", nbytes=10))
    with pytest.raises(RuntimeError):
        req.wait()
    m = Manual("again", nbytes=100)
    for _ in range(5):  # re-posted: one set of subscriptions, one span per run
        m.reset()
        req = ctx.submit(m)
        m.finish()
        req.wait()
    assert len(m.listeners(Event.COMPLETED)) == 1  # the tracer's only
    doc = traced()
    comm = spans(doc, "comm")
    (big,) = [e for e in comm if e["name"] == "big"]
    assert big["args"]["parts"] == 4 and big["args"]["credit"] == 0 and big["args"]["priority"] == 3
    parts = [e for e in comm if e["name"].startswith("big[")]
    assert sorted(e["name"] for e in parts) == [f"big[{k}]" for k in range(4)]
    assert all(e["args"]["credit"] == 1 << 20 and e["args"]["parent"] == "big/parts" for e in parts)
    assert all(big["ts"] <= e["ts"] and e["ts"] + e["dur"] <= big["ts"] + big["dur"] + 1 for e in parts)
    (boom,) = [e for e in comm if e["name"] == "boom"]
    assert boom["args"]["outcome"] == "error" and "boom" in boom["args"]["error"]
    assert len([e for e in comm if e["name"] == "again"]) == 5


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    from pycoll.trace import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(pycoll.PycollError, match="pip install matplotlib"):
        plot.plot([str(tmp_path / "none.json")], str(tmp_path / "x.png"))
