"""The progress engine: priority queue, credit gate, partitioning, idle back-off, settings."""

import threading
import time

import numpy as np
import pytest

import pycoll
from pycoll import Context, Schedule, Task
from pycoll.tasks import CopyTask
from tests.conftest import Manual, Recorder


def finish_all(ctx, tasks, order):
    """Finish in-progress Manual tasks one at a time, recording start order, until all are done."""
    while not all(t.done for t in tasks):
        running = [t for t in tasks if t.state.name == "IN_PROGRESS"]
        assert running, "nothing running but tasks unfinished"
        running[0].finish()
        ctx.progress()
    return order


def test_credit_of_one_task_posts_strictly_by_priority():
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    log = []
    prios = [3, 1, 4, 0, 2, 1]
    tasks = [Manual(f"p{p}-{i}", log, priority=p, nbytes=100) for i, p in enumerate(prios)]
    req = ctx.submit(Schedule(tasks, name="s"))
    assert log == ["p0-3"] and ctx.in_flight == 100
    finish_all(ctx, tasks, log)
    req.wait()
    assert log == ["p0-3", "p1-1", "p1-5", "p2-4", "p3-0", "p4-2"]  # FIFO within priority 1
    assert ctx.in_flight == 0
    assert ctx.stats["credit_waits"] > 0


def test_urgent_task_that_becomes_ready_later_goes_first():
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    log = []
    low = [Manual(f"low{i}", log, priority=10, nbytes=100) for i in range(3)]
    ctx.submit(Schedule(low, name="low"))
    assert log == ["low0"]
    urgent = Manual("urgent", log, priority=0, nbytes=100)
    ctx.submit(urgent)
    assert log == ["low0"]  # credit is taken: it waits, but at the head of the queue
    low[0].finish()
    ctx.progress()
    assert log == ["low0", "urgent"]
    finish_all(ctx, low + [urgent], log)
    assert log == ["low0", "urgent", "low1", "low2"]


def test_ample_credit_lets_tasks_overlap():
    ctx = Context(credit_bytes=1000, partition_bytes=0, timeout=0)
    log = []
    tasks = [Manual(f"t{i}", log, priority=i, nbytes=100) for i in range(12)]
    ctx.submit(Schedule(tasks, name="s"))
    assert len(log) == 10 and ctx.in_flight == 1000  # ten fit
    finish_all(ctx, tasks, log)
    assert ctx.in_flight == 0


def test_unlimited_credit_and_task_larger_than_credit_runs_alone():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    log = []
    tasks = [Manual(f"t{i}", log, nbytes=10**9) for i in range(4)]
    ctx.submit(Schedule(tasks))
    assert len(log) == 4
    ctx2 = Context(credit_bytes=10, partition_bytes=0, timeout=0)
    log2 = []
    big = [Manual(f"b{i}", log2, nbytes=1000) for i in range(2)]
    ctx2.submit(Schedule(big))
    assert log2 == ["b0"]  # larger than the credit: posts when nothing else is in flight
    finish_all(ctx2, big, log2)
    assert log2 == ["b0", "b1"]


def test_tasks_without_credit_do_not_take_any():
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    log = []
    sched = Schedule([Manual("a", log, nbytes=100), Schedule([Recorder("inner", log)], name="inner")])
    ctx.submit(sched)
    assert sorted(log) == ["a", "inner"]  # a schedule takes no credit: its task runs beside "a"


def test_credit_returned_on_failure_and_cancel():
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    a = Manual("a", nbytes=100)
    req = ctx.submit(a)
    assert ctx.in_flight == 100
    a.fail(RuntimeError("x"))
    assert ctx.in_flight == 0
    with pytest.raises(RuntimeError):
        req.wait()
    b = Manual("b", nbytes=100)
    ctx.submit(b)
    b.cancel()
    assert ctx.in_flight == 0


def test_partitioning_splits_into_fragments_that_inherit_priority():
    ctx = Context(credit_bytes=1 << 20, partition_bytes=1 << 20, timeout=0)
    src = np.arange(10 << 18, dtype=np.float32)  # 10 MiB
    dst = np.zeros_like(src)
    starts = []
    ctx.on_start = lambda task: starts.append((task.name, task.effective_priority, task.nbytes))
    copy = CopyTask(dst, src, name="big", priority=7)
    ctx.submit(copy).wait()
    np.testing.assert_array_equal(dst, src)
    parts = [s for s in starts if s[0].startswith("big[")]
    assert [p[0] for p in parts] == [f"big[{k}]" for k in range(10)]
    assert all(p[1] == 7 and p[2] == 1 << 20 for p in parts)
    assert ctx.stats["partitioned"] == 1 and ctx.in_flight == 0


def test_partitioned_fragments_let_urgent_work_in_between():
    ctx = Context(credit_bytes=1 << 20, partition_bytes=1 << 20, timeout=0)
    order = []
    ctx.on_start = lambda task: order.append(task.name)
    src, dst = np.ones(4 << 20, np.uint8), np.zeros(4 << 20, np.uint8)

    class Slow(CopyTask):
        """A copy that takes a second pass of the engine, so fragments are in flight."""

        def post(self):
            self.dst[:] = self.src

        def progress(self):
            self.complete()

        def split(self, max_bytes):
            return [Slow(self.dst[i:i + max_bytes], self.src[i:i + max_bytes], name=f"{self.name}[{i >> 20}]")
                    for i in range(0, self.dst.nbytes, max_bytes)]

    ctx.submit(Slow(dst, src, name="bulk", priority=5))
    ctx.submit(Recorder("urgent", [], priority=0, nbytes=10))
    ctx.run()
    assert order.index("urgent") < order.index("bulk[2]")
    assert (dst == 1).all()


def test_waiting_rank_backs_off_instead_of_spinning():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    m = Manual("later")
    req = ctx.submit(m)
    timer = threading.Timer(0.5, m.finish)
    timer.start()
    cpu0, wall0 = time.process_time(), time.monotonic()
    req.wait()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    timer.join()
    assert wall >= 0.45
    assert cpu < 0.5 * wall, f"waiting used {cpu:.3f} s of CPU in {wall:.3f} s"


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("PYCOLL_CREDIT_BYTES", "4M")
    monkeypatch.setenv("PYCOLL_PARTITION_BYTES", "512K")
    monkeypatch.setenv("PYCOLL_TIMEOUT", "2.5")
    ctx = Context()
    assert (ctx.credit_bytes, ctx.partition_bytes, ctx.timeout) == (4 << 20, 512 << 10, 2.5)
    monkeypatch.setenv("PYCOLL_CREDIT_BYTES", "lots")
    with pytest.raises(pycoll.ConfigError, match="PYCOLL_CREDIT_BYTES='lots'"):
        Context()
    monkeypatch.setenv("PYCOLL_CREDIT_BYTES", "inf")
    monkeypatch.setenv("PYCOLL_TIMEOUT", "0")
    ctx = Context()
    assert ctx.credit_bytes == 0 and ctx.timeout == float("inf")
    assert ctx.backoff[0] == pytest.approx(20e-6)  # PYCOLL_SPIN_US's default
    monkeypatch.setenv("PYCOLL_SPIN_US", "5000")  # spins 5 ms: yields no sooner than that
    assert Context().backoff[:2] == pytest.approx((5e-3, 5e-3))
    for bad in ("-1", "soon", "inf"):
        monkeypatch.setenv("PYCOLL_SPIN_US", bad)
        with pytest.raises(pycoll.ConfigError, match="PYCOLL_SPIN_US"):
            Context()


def test_many_tasks_complete_quickly():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    sched = Schedule(name="chain")
    prev = None
    for _ in range(20000):
        prev = sched.add(Task(), after=prev)
    t0 = time.perf_counter()
    ctx.submit(sched).wait()
    assert time.perf_counter() - t0 < 2.0  # ~0.05 s expected; a generous bound against regressions


def test_work_without_credit_never_waits_behind_blocked_work():
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    log = []
    first = Manual("holds-credit", log, nbytes=100)
    ctx.submit(first)
    ctx.submit(Manual("blocked", log, nbytes=100, priority=-5))
    inner = Manual("inner", log, nbytes=100)
    ctx.submit(Schedule([inner], name="late-schedule", priority=9))  # takes no credit itself
    assert log == ["holds-credit"]
    assert inner.state.name == "NOT_READY" and inner.pending == 0  # activated, queued for credit
    first.finish()
    ctx.progress()
    assert log == ["holds-credit", "blocked"]  # then priority decides among credit takers


def test_standing_still_overdraws_the_credit():
    """Work held back by credit while nothing moves for stall_s starts anyway, one task per stall
    (the deadlock breaker for ranks no peer's message can start); while things move it does not."""
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    ctx.stall_s = 0.05
    log = []
    first, second, third = (Manual(f"t{i}", log, nbytes=100) for i in range(3))
    reqs = [ctx.submit(t) for t in (first, second, third)]
    assert log == ["t0"]
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.03:  # still, but not long enough
        ctx.progress()
    assert log == ["t0"] and ctx.stats["stall_starts"] == 0
    while len(log) < 2 and time.monotonic() - t0 < 5:
        ctx.progress()
        time.sleep(0.001)
    assert log == ["t0", "t1"] and ctx.stats["stall_starts"] == 1 and ctx.in_flight == 200
    for t in (first, second, third):
        t.finish()
    for r in reqs:
        r.wait(5)
    assert ctx.in_flight == 0
