"""The background progress thread (what completes torch futures nobody waits on), the team's
point-to-point requests and the receive from any source, on in-process ranks."""

import threading
import time

import numpy as np
import pytest

import pycoll
from pycoll.engine.progress_thread import ProgressThread


def _post_allreduce(teams, bufs):
    ctx = teams[0].ctx
    with ctx.lock:
        return [t.allreduce(b) for t, b in zip(teams, bufs)]


def test_callback_runs_in_the_thread_without_wait():
    teams = pycoll.local_teams(3)
    pt = ProgressThread(teams[0].ctx)
    try:
        bufs = [np.full(1000, float(r + 1)) for r in range(3)]
        fired = threading.Event()
        seen = {}

        def done(error):
            seen["error"] = error
            seen["thread"] = threading.current_thread().name
            fired.set()

        w = pt.watch(_post_allreduce(teams, bufs), done)
        assert fired.wait(10), "the progress thread did not complete the collective"
        assert seen == {"error": None, "thread": "pycoll-progress"}
        assert w.called
        for b in bufs:
            assert (b == 6.0).all()
    finally:
        pt.close()


def test_wait_drives_in_the_caller_and_runs_the_callback_once():
    teams = pycoll.local_teams(2)
    pt = ProgressThread(teams[0].ctx)
    try:
        calls = []
        for i in range(50):
            bufs = [np.ones(4), np.ones(4)]
            w = pt.watch(_post_allreduce(teams, bufs), calls.append, background=i % 2 == 0)
            pt.wait(w, timeout=10)
            assert w.called and (bufs[0] == 2).all()
        time.sleep(0.05)
        assert calls == [None] * 50  # each callback exactly once, whoever saw the end first
    finally:
        pt.close()


def test_error_reaches_the_callback_and_wait_times_out():
    a, b = pycoll.local_teams(2)
    pt = ProgressThread(a.ctx)
    try:
        with a.ctx.lock:
            req = a.allreduce(np.ones(4), timeout=0.3)  # rank 1 never joins
        errors = []
        w = pt.watch([req], errors.append)
        with pytest.raises(pycoll.TimeoutError):
            pt.wait(w, timeout=0.05)  # the caller's own limit: the collective goes on
        deadline = time.monotonic() + 10
        while not w.called and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.called
        assert len(errors) == 1 and isinstance(errors[0], pycoll.TimeoutError)
        assert "did not finish within" in str(errors[0])
    finally:
        pt.close()


def test_idle_thread_sleeps():
    teams = pycoll.local_teams(2)
    pt = ProgressThread(teams[0].ctx)
    try:
        pt.wait(pt.watch(_post_allreduce(teams, [np.ones(2), np.ones(2)]), lambda e: None), timeout=10)
        time.sleep(0.05)
        before = time.thread_time()
        t0 = time.process_time()
        time.sleep(0.3)
        assert time.process_time() - t0 < 0.05, "an idle progress thread burns CPU"
        assert time.thread_time() - before < 0.05
    finally:
        pt.close()


def test_send_recv_requests_and_any_source():
    teams = pycoll.local_teams(4)
    a = teams[0]
    got = []
    reqs = []
    for _ in range(3):
        buf = np.zeros(2)
        reqs.append((a.irecv(buf, None, tag="t"), buf))
    for r in (3, 1, 2):
        teams[r].isend(np.full(2, float(r)), 0, tag="t").wait(5)
    for req, buf in reqs:
        req.wait(5)
        assert buf[0] == req.task.source
        got.append(req.task.source)
    assert sorted(got) == [1, 2, 3]
    exact = np.zeros(3)
    req = a.irecv(exact, 2, tag=9)
    teams[2].isend(np.arange(3.0), 0, tag=9)
    req.wait(5)
    assert req.task.source == 2 and list(exact) == [0.0, 1.0, 2.0]


def test_any_source_times_out_naming_the_wait():
    a, _ = pycoll.local_teams(2)
    req = a.irecv(np.zeros(1), None, tag="never", timeout=0.1)
    with pytest.raises(pycoll.TimeoutError, match="any rank"):
        req.wait(5)
