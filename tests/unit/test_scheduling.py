"""pycoll.scheduling: partitions, priorities, credit, readiness in any order, immediate tensors,
the auto-tuner, in process. On real ranks: tests/procs/test_scheduling.py."""

import threading

import numpy as np
import pytest

import pycoll
from pycoll.scheduling import IMMEDIATE, PART_STRIDE, AutoTuner, Scheduler

# (they count messages, bytes or spans, or look inside a request's task: see the fixture)
pytestmark = pytest.mark.usefixtures("no_agreement_check")



def _run_local(n, body):
    teams = pycoll.local_teams(n)
    errors = []

    def run(team):
        try:
            body(team)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in teams]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]


def test_parts_priorities_and_random_readiness():
    def body(team):
        sched = Scheduler(team, partition_bytes=1024, credit_bytes=1024, tuning="off", timeout=30)
        rng = np.random.default_rng(team.rank)
        arrays = {f"w{i}": np.full(100 * (i + 1), float(team.rank + i)) for i in range(8)}
        handles = {name: sched.submit(name, a, priority=i, ready=False)
                   for i, (name, a) in enumerate(arrays.items())}
        for name in rng.permutation(list(arrays)):
            sched.notify_ready(str(name))
        for i, (name, a) in enumerate(arrays.items()):
            h = handles[name]
            h.wait(timeout=30)
            assert np.all(a == sum(r + i for r in range(team.size)))
            assert len(h.requests) == -(-a.nbytes // 1024)
            prios = [r.task.priority for r in h.requests]
            assert prios == [i * PART_STRIDE + k for k in range(len(prios))]  # priority, then part
            assert h.requests[0].task.name == f"{name}/part0"
        assert not sched.pending

    _run_local(3, body)


def test_immediate_takes_no_credit_and_goes_first():
    def body(team):
        sched = Scheduler(team, partition_bytes=256, credit_bytes=256, tuning="off", timeout=30)
        a = np.ones(1000)
        h = sched.submit("now", a, priority=5, immediate=True)
        task = h.requests[0].task
        assert len(h.requests) == 1 and task.credit == 0 and task.priority == IMMEDIATE
        h.wait(timeout=30)
        assert np.all(a == team.size)

    _run_local(2, body)


def test_bad_input_is_refused_before_sending():
    team = pycoll.local_teams(1)[0]
    sched = Scheduler(team, tuning="off")
    with pytest.raises(ValueError, match="name"):
        sched.submit("", np.ones(3))
    with pytest.raises(TypeError, match="priority"):
        sched.submit("x", np.ones(3), priority=1.5)
    with pytest.raises(ValueError, match="priority"):
        sched.submit("x", np.ones(3), priority=PART_STRIDE)
    with pytest.raises(KeyError):
        sched.notify_ready("nobody")
    h = sched.submit("later", np.ones(3), ready=False)
    with pytest.raises(pycoll.PycollError, match="never made ready"):
        h.wait()
    with pytest.raises(ValueError, match="already scheduled"):
        sched.submit("later", np.ones(3))
    sched.notify_ready("later")
    with pytest.raises(ValueError, match="already made ready"):
        sched.notify_ready("later")
    h.wait()
    with pytest.raises(ValueError, match="tuning"):
        Scheduler(team, tuning="bogus")
    with pytest.raises(ValueError):
        AutoTuner(credit=False, partition=False)


def test_tuning_setting(monkeypatch):
    team = pycoll.local_teams(1)[0]
    assert Scheduler(team, tuning="off").tuner is None
    tuner = Scheduler(team, tuning="credit,partition").tuner
    assert tuner.tune_credit and tuner.tune_partition
    monkeypatch.setenv("PYCOLL_SCHED_TUNING", "partition")
    monkeypatch.setenv("PYCOLL_SCHED_PARTITION_BYTES", "64K")
    sched = Scheduler(team, credit_bytes="1M")
    assert not sched.tuner.tune_credit and sched.tuner.tune_partition
    assert sched.partition_bytes == 64 << 10 and team.ctx.credit_bytes == 1 << 20
