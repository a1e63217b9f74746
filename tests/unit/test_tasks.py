"""Tasks and schedules: state transitions, dependencies, errors, cancel, timeouts, nesting, reuse."""

import time

import numpy as np
import pytest

import pycoll
from pycoll import Context, Event, Schedule, Task, TaskState
from pycoll.tasks import CopyTask, FunctionTask
from tests.conftest import Boom, Manual, Recorder


def ctx():
    return Context(credit_bytes=0, partition_bytes=0, timeout=0)


def test_noop_task_lifecycle_and_events():
    c, seen = ctx(), []
    t = Task("t")
    for ev in (Event.STARTED, Event.COMPLETED):
        t.subscribe(ev, None, lambda lis, src, data, ev=ev: seen.append((ev, src.state)))
    assert t.state is TaskState.NOT_READY and not t.done
    req = c.submit(t)
    assert req.wait() is None
    assert t.state is TaskState.COMPLETED and t.done
    assert seen == [(Event.STARTED, TaskState.IN_PROGRESS), (Event.COMPLETED, TaskState.COMPLETED)]


def test_polled_task_in_progress_until_complete():
    c = ctx()
    t = Manual("m")
    req = c.submit(t)
    assert t.state is TaskState.IN_PROGRESS
    assert not req.test()
    t.finish()
    assert req.test()
    assert t.state is TaskState.COMPLETED


def test_complete_before_start_is_an_error_and_submit_twice_too():
    t = Task("x")
    with pytest.raises(RuntimeError, match="never started"):
        t.complete()
    c = ctx()
    c.submit(t).wait()
    t.complete()  # completing a finished task is a no-op
    with pytest.raises(RuntimeError, match="already submitted"):
        c.submit(t)


def test_function_task_result():
    c = ctx()
    assert c.submit(FunctionTask(lambda a, b: a + b, 2, 3)).wait() == 5


def test_dependency_counting_waits_for_all():
    c, log = ctx(), []
    a, b = Manual("a", log), Manual("b", log)
    join = Recorder("join", log)
    s = Schedule(name="s")
    s.add(a)
    s.add(b)
    s.add(join, after=[a, b])
    req = c.submit(s)
    assert log == ["a", "b"]
    a.finish()
    c.progress()
    assert join.state is TaskState.NOT_READY and join.pending == 1
    b.finish()
    req.wait()
    assert log == ["a", "b", "join"]
    assert join.dependencies == [a, b]


def test_exception_in_post_fails_task_schedule_and_request():
    c, log = ctx(), []
    s = Schedule(name="s")
    first = s.add(Recorder("first", log))
    boom = s.add(Boom("boom"), after=first)
    after = s.add(Recorder("after", log), after=boom)
    other = s.add(Manual("other", log))
    req = c.submit(s)
    with pytest.raises(RuntimeError, match="boom exploded"):
        req.wait()
    assert boom.state is TaskState.ERROR
    assert after.state is TaskState.CANCELED and isinstance(after.error, RuntimeError)
    assert other.state is TaskState.CANCELED
    assert s.state is TaskState.ERROR and s.error is boom.error
    assert s.failed_task is boom
    assert "after" not in log


def test_exception_in_progress_fails_task():
    c = ctx()
    req = c.submit(Boom("p", when="progress", exc=ValueError("bad value")))
    with pytest.raises(ValueError, match="bad value"):
        req.wait()
    assert req.state is TaskState.ERROR


def test_standalone_dependant_of_failed_task_is_canceled_with_cause():
    c = ctx()
    boom = Boom("b")
    dep = Task("dep")
    dep.depends_on(boom)
    r_dep = c.submit(dep)
    c.submit(boom)
    with pytest.raises(RuntimeError, match="exploded"):
        r_dep.wait()
    assert dep.state is TaskState.CANCELED


def test_cancel_not_ready_and_in_progress():
    c = ctx()
    m = Manual("m")
    cancels = []
    m.subscribe(Event.CANCELED, None, lambda *a: cancels.append(1))
    req = c.submit(m)
    assert req.cancel()
    assert not req.cancel()
    assert m.state is TaskState.CANCELED and cancels == [1]
    with pytest.raises(pycoll.CanceledError):
        req.wait()
    # queued (waiting for a dependency) then canceled: never posted
    gate, log = Manual("gate"), []
    waiting = Recorder("waiting", log)
    waiting.depends_on(gate)
    c.submit(waiting)
    c.submit(gate)
    waiting.cancel()
    gate.finish()
    c.run()
    assert log == [] and waiting.state is TaskState.CANCELED


def test_cancel_schedule_cancels_children():
    c = ctx()
    s = Schedule([Manual("a"), Manual("b")], name="s")
    nested = Schedule([Manual("c")], name="nested")
    s.add(nested)
    req = c.submit(s)
    req.cancel()
    assert all(t.state is TaskState.CANCELED for t in s.tasks)
    assert nested.tasks[0].state is TaskState.CANCELED
    with pytest.raises(pycoll.CanceledError):
        req.wait()


def test_canceled_child_cancels_schedule():
    c = ctx()
    a = Manual("a")
    s = Schedule([a, Manual("b")], name="s")
    req = c.submit(s)
    a.cancel()
    assert s.state is TaskState.CANCELED
    with pytest.raises(pycoll.CanceledError):
        req.wait()


def test_nested_schedules_and_priority_inheritance():
    c, log = ctx(), []
    inner = Schedule([Recorder("i1", log), Recorder("i2", log)], name="inner")
    outer = Schedule(name="outer", priority=5)
    first = outer.add(Recorder("o1", log))
    outer.add(inner, after=first)
    last = outer.add(Recorder("o2", log), after=inner)
    c.submit(outer).wait()
    assert log == ["o1", "i1", "i2", "o2"]
    assert inner.effective_priority == 5 and inner.tasks[0].effective_priority == 5
    assert last.effective_priority == 5
    assert outer.state is TaskState.COMPLETED


def test_schedule_progress_event_and_empty_schedule():
    c = ctx()
    s = Schedule([Task("a"), Task("b"), Task("c")], name="s")
    progress = []
    s.subscribe(Event.PROGRESS, None, lambda lis, src, child: progress.append(child.name))
    c.submit(s).wait()
    assert progress == ["a", "b"]  # the last completion completes the schedule instead
    assert c.submit(Schedule(name="empty")).wait() is None


def test_adding_to_started_schedule_or_twice_is_refused():
    c = ctx()
    t = Task("t")
    s = Schedule([t], name="s")
    with pytest.raises(ValueError, match="already belongs"):
        Schedule(name="other").add(t)
    c.submit(s).wait()
    with pytest.raises(RuntimeError, match="before the schedule starts"):
        s.add(Task())
    with pytest.raises(RuntimeError, match="before the task starts"):
        t.depends_on(Task())


def test_task_timeout_names_the_task():
    c = ctx()
    m = Manual("stuck-recv", timeout=0.05)
    req = c.submit(m)
    with pytest.raises(pycoll.TimeoutError, match="stuck-recv did not finish within 0.05 s") as info:
        req.wait()
    assert info.value.task is m
    assert m.state is TaskState.ERROR


def test_schedule_timeout_names_what_it_waits_on():
    c = ctx()
    s = Schedule(name="coll", timeout=0.05)
    done = s.add(Task("fast"))
    s.add(Manual("recv from rank 3"), after=done)
    req = c.submit(s)
    with pytest.raises(pycoll.TimeoutError, match="waiting on: recv from rank 3") as info:
        req.wait()
    assert [t.name for t in info.value.waiting_on] == ["recv from rank 3"]
    assert isinstance(info.value, TimeoutError)  # also the builtin
    assert s.tasks[1].state is TaskState.CANCELED


def test_wait_timeout_raises_and_task_keeps_running():
    c = ctx()
    m = Manual("slow")
    req = c.submit(m)
    t0 = time.monotonic()
    with pytest.raises(pycoll.TimeoutError, match="slow"):
        req.wait(timeout=0.05)
    assert time.monotonic() - t0 < 1.0
    assert m.state is TaskState.IN_PROGRESS
    m.finish()
    req.wait()


def test_reset_and_repost_schedule():
    c, log = ctx(), []
    s = Schedule(name="s")
    a = s.add(Recorder("a", log))
    s.add(Recorder("b", log), after=a)
    c.submit(s).wait()
    s.reset()
    c.submit(s).wait()
    assert log == ["a", "b", "a", "b"]


def test_copy_task_and_errors():
    c = ctx()
    src = np.arange(10, dtype=np.float64)
    dst = np.zeros(10)
    c.submit(CopyTask(dst, src)).wait()
    np.testing.assert_array_equal(dst, src)
    with pytest.raises(ValueError, match="bytes"):
        CopyTask(np.zeros(3), src)
    with pytest.raises(ValueError, match="not contiguous"):
        CopyTask(np.zeros(20)[::2], src)
    with pytest.raises(ValueError, match="read-only"):
        CopyTask(src.view().setflags(write=False) or np.frombuffer(b"x" * 80), src)


def test_a_task_tells_its_schedule_after_its_listeners():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    sched = Schedule(name="s")
    a = sched.add(Task("a"))
    b = sched.add(Task("b"), after=a)
    log = []
    a.subscribe(Event.COMPLETED, None, lambda lis, src, data: log.append(("a done", sched.state.name)))
    sched.subscribe(Event.COMPLETED, None, lambda lis, src, data: log.append(("sched done", b.state.name)))
    ctx.submit(sched).wait()
    assert log == [("a done", "IN_PROGRESS"), ("sched done", "COMPLETED")]
    assert a.dependencies == [] and b.dependencies == [a] and b.n_deps == 1
    assert a.listeners(Event.COMPLETED) == [b, None]  # the schedule is not a subscriber
