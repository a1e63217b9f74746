"""The short path of a small collective: a task submitted to an idle engine that nobody traces
starts inside ``submit`` (and often finishes there), yet it is still a task of the one engine:
ordered by priority, held by credit, failing with TimeoutError when its peer never comes, traced
when PYCOLL_TRACE is set. Multi-rank checks on a shared segment: tests/procs/test_lean_path.py."""

import time
from types import SimpleNamespace

import numpy as np
import pytest

import pycoll
from pycoll import Context, Task, persistent
from pycoll.engine.express import has_express_lane
from pycoll.engine.request import Request
from pycoll.tasks.task import COMPLETED
from tests.conftest import Manual, Recorder
from tests.unit.test_trace import spans, traced  # noqa: F401 - the fixture

# (they count messages, bytes or spans, or look inside a request's task: see the fixture)
pytestmark = pytest.mark.usefixtures("no_agreement_check")



def test_idle_engine_starts_and_finishes_the_task_inside_submit():
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    log = []
    req = ctx.submit(Recorder("quick", log, nbytes=50, timeout=30), priority=3)
    assert log == ["quick"] and req.done and ctx.posted == 1
    assert ctx._deadlines == []  # done in post(): it can never time out, so it got no deadline
    assert req.wait() is None and ctx.in_flight == 0
    slow = Manual("slow", log, nbytes=50, timeout=30)
    sreq = ctx.submit(slow)
    assert slow.state.name == "IN_PROGRESS" and len(ctx._deadlines) == 1  # still running: a deadline
    slow.finish()
    sreq.wait()


def test_short_path_never_jumps_queued_work_nor_the_credit():
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    log = []
    holder = Manual("holder", log, nbytes=100)
    ctx.submit(holder)  # idle: started at once, holds all the credit
    later = Manual("later", log, nbytes=100, priority=5)
    ctx.submit(later)
    assert log == ["holder"]  # no credit left: queued
    urgent = Manual("urgent", log, nbytes=100, priority=1)
    ctx.submit(urgent)  # more urgent than what is queued, but the credit holds it too
    assert log == ["holder"]
    ctx.submit(Recorder("free", log))  # takes no credit: never waits behind blocked work
    assert log == ["holder", "free"]
    holder.finish()
    ctx.progress()
    assert log == ["holder", "free", "urgent"]
    urgent.finish()
    ctx.progress()
    assert log == ["holder", "free", "urgent", "later"]
    later.finish()
    ctx.progress()
    # queue empty, credit free: the next one takes the short path again
    req = ctx.submit(Recorder("after", log, nbytes=100))
    assert req.done and log[-1] == "after"


def test_start_order_under_priority_and_credit_read_back_from_the_trace(traced):  # noqa: F811
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    assert ctx.on_start is not None  # traced: every start goes through the hook
    log = []
    holder = Manual("holder", log, nbytes=100)
    tasks = [holder] + [Manual(f"p{p}", log, nbytes=100, priority=p) for p in (4, 0, 2)]
    for task in tasks:
        ctx.submit(task)
    while not all(t.done for t in tasks):
        for t in tasks:
            if t.state.name == "IN_PROGRESS":
                t.finish()
        ctx.progress()
    doc = traced()
    comm = sorted(spans(doc, "comm"), key=lambda e: e["ts"])
    assert [e["name"] for e in comm] == ["holder", "p0", "p2", "p4"] == log
    assert [e["args"]["start"] for e in comm] == ["submit", "queue", "queue", "queue"]
    assert all(e["args"]["in_flight"] == 0 for e in comm)  # one at a time: the credit held the rest
    # the short path is off while tracing: a task that finishes inside submit is still traced
    ctx.submit(Recorder("quick", log))
    assert [e["name"] for e in spans(traced(), "comm")][-1] == "quick"


def test_timeout_on_the_short_path_is_an_error_not_a_hang():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    never = Manual("never-finishes", nbytes=8, timeout=0.2)
    t0 = time.monotonic()
    req = ctx.submit(never)  # idle engine: started inside submit, in progress after post()
    with pytest.raises(pycoll.TimeoutError, match="never-finishes did not finish within 0.2 s"):
        req.wait()
    assert time.monotonic() - t0 < 5


def test_collective_whose_peer_never_calls_times_out_naming_the_peer():
    teams = pycoll.local_teams(2, Context(credit_bytes=0, partition_bytes=0, timeout=0))
    t0 = time.monotonic()
    req = teams[0].allreduce(np.ones(4), timeout=0.3)  # rank 1 never calls
    with pytest.raises(pycoll.TimeoutError, match="from rank 1") as info:
        req.wait()
    assert time.monotonic() - t0 < 5
    assert "did not finish within 0.3 s" in str(info.value)


def test_request_of_a_task_finished_in_submit_keeps_its_task_until_collected():
    teams = pycoll.local_teams(1)
    x = np.ones(4)
    first = teams[0].allreduce(x)  # a team of one: done inside submit
    assert first.done
    task = first.task
    second = teams[0].allreduce(np.ones(4))  # same shape: the pool is empty, a new task
    assert second.task is not task and first.task is task
    first.wait()  # collected: the task goes back to the pool
    third = teams[0].allreduce(np.ones(4))
    assert third.task is task
    second.wait(), third.wait()


def test_persistent_short_path_reuses_its_task_and_sees_refilled_buffers():
    n = 3
    teams = pycoll.local_teams(n)
    src = [np.zeros(64, np.float32) for _ in range(n)]
    dst = [np.zeros(64, np.float32) for _ in range(n)]
    pers = [t.allreduce_init(s, d) for t, s, d in zip(teams, src, dst)]
    tasks = set()
    for run in range(20):
        for r in range(n):
            src[r][:] = r * run + 1
        reqs = [p.start() for p in pers]
        pycoll.wait_all(reqs)
        tasks.add(id(pers[0].task))
        assert all(p.task.state is COMPLETED for p in pers)
        for r in range(n):
            assert (dst[r] == sum(q * run + 1 for q in range(n))).all(), (run, r, dst[r][:3])
    assert len(tasks) == 1


def test_plain_task_request_outcome_is_taken_at_submit():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    done = []
    req = ctx.submit(Task("noop"), on_done=lambda r: done.append(r))
    assert isinstance(req, Request) and req.done and done == []  # on_done waits for the collection
    req.wait()
    req.wait()
    assert done == [req]


class Lanes:
    """The segment side of an express lane, scripted: ``run(st, gen, budget)`` answers from
    ``answers`` (1: done at once; 0: started, waits for peers; < 0: failed), as the native call does."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.turn = self.tickets = 0
        self.broken = None
        self.budget = 8
        self.calls = 0

    def express_call(self):
        return self.run, "gen"

    def run(self, st, gen, budget):
        assert (st, gen, budget) == ("native", "gen", 8)
        self.calls += 1
        return self.answers.pop(0)

    def ran(self, rc):
        if rc < 0:
            self.broken = pycoll.TransportError(f"shm: failed ({rc})")
            raise self.broken
        self.tickets += 1
        return False


class Again(Manual):
    """A task of a segment collective whose express runs are scripted (:class:`Lanes`); logs each."""

    takes_credit = False
    averages = False

    def __init__(self, name, log, answers, **kw):
        super().__init__(name, log, **kw)
        self.seg = Lanes(answers)
        self.native = "native"

    def express_started(self, rc):
        self.log.append(f"{self.name}!")
        self.state = pycoll.tasks.task.IN_PROGRESS
        self.pending = 0
        self.finish_now = False
        try:
            self.seg.ran(rc)
        except Exception as exc:
            self.fail(exc)


def _finished(task, ctx):
    ctx.submit(task)
    task.finish()
    ctx.progress()
    assert task.state is COMPLETED


def test_express_lane_runs_a_task_again_only_on_an_idle_engine():
    ctx = Context(credit_bytes=100, partition_bytes=0, timeout=0)
    log = []
    again = Again("again", log, [1, 1, 0], timeout=0.2)
    _finished(again, ctx)
    seq = iter(range(100))
    owner = SimpleNamespace(request=None)
    lane = ctx.express_lane(again, seq, "out", owner)
    posted = ctx.posted
    req = lane.run()
    assert req.done and req.wait() == "out" and ctx.posted == posted + 1 and next(seq) == 1
    assert ctx.pending() == 0 and ctx._deadlines == [] and again.seg.calls == 1
    # work in the engine closes the lane: nothing is run, no sequence number taken
    holder = Manual("holder", log, nbytes=100)
    ctx.submit(holder)  # in progress (polled)
    blocked = Manual("blocked", log, nbytes=100, priority=0)
    ctx.submit(blocked)  # queued behind the credit
    assert lane.run() is None and again.seg.calls == 1 and next(seq) == 2
    holder.finish()
    ctx.progress()
    blocked.finish()
    ctx.progress()
    assert ctx.pending() == 0
    # so does an earlier collective holding the segment, or a broken segment
    again.seg.tickets += 1
    assert lane.run() is None
    again.seg.turn += 1
    assert lane.run() is req and again.seg.calls == 2  # every run done at once: the same request
    assert owner.request is req
    # a run that does not finish at once is the engine's: polled, with its deadline
    waiting = lane.run()
    assert not waiting.done and ctx.pending() == 1 and len(ctx._deadlines) == 1 and log[-1] == "again!"
    assert owner.request is waiting and lane.run() is None  # not finished: closed
    t0 = time.monotonic()
    with pytest.raises(pycoll.TimeoutError, match="again did not finish within 0.2 s"):
        waiting.wait()
    assert time.monotonic() - t0 < 5


def test_express_lane_waits_until_the_last_run_was_collected():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    again = Again("again", [], [0, 1])
    _finished(again, ctx)
    owner = SimpleNamespace(request=None)
    lane = ctx.express_lane(again, iter(range(10)), None, owner)
    waiting = lane.run()
    again.finish()
    ctx.progress()  # finished, but nobody has seen it yet
    again.seg.turn += 1  # (as the segment's progress does when the collective is done)
    assert again.state is COMPLETED and not waiting.collected
    assert lane.run() is None and again.seg.calls == 1  # its outcome would be lost: closed
    waiting.wait()
    assert lane.run() is lane.done and again.seg.calls == 2


def test_express_lane_run_that_fails_breaks_the_segment_and_fails_the_request():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    again = Again("again", [], [-3])
    _finished(again, ctx)
    lane = ctx.express_lane(again, iter(range(10)), None, SimpleNamespace(request=None))
    req = lane.run()
    with pytest.raises(pycoll.TransportError, match="failed"):
        req.wait()
    assert again.seg.broken is not None and lane.run() is None and ctx.pending() == 0


def test_express_lane_is_closed_to_tasks_that_take_credit_or_have_listeners():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    log = []
    credited = Again("credited", log, [1], nbytes=8)
    credited.credit = 8
    _finished(credited, ctx)
    assert not has_express_lane(credited) and has_express_lane(Again("plain", log, []))
    watched = Again("watched", log, [1])
    _finished(watched, ctx)
    watched.subscribe(pycoll.Event.COMPLETED, Task("listener"))
    lane = ctx.express_lane(watched, iter(range(10)), None, SimpleNamespace(request=None))
    assert lane.run() is None and watched.seg.calls == 0


def test_express_lane_is_closed_while_tracing(traced):  # noqa: F811
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    log = []
    again = Again("again", log, [1])
    _finished(again, ctx)
    lane = ctx.express_lane(again, iter(range(10)), None, SimpleNamespace(request=None))
    assert ctx.on_start is not None and lane.run() is None
    assert again.seg.calls == 0


def test_repeated_calls_become_one_persistent_collective_in_process():
    n = 2
    teams = pycoll.local_teams(n)
    x = [np.zeros(4, np.float32) for _ in range(n)]
    y = [np.zeros(4, np.float32) for _ in range(n)]
    for i in range(6):
        for r in range(n):
            x[r][:] = r + i
        reqs = [t.allreduce(a, b) for t, a, b in zip(teams, x, y)]
        pycoll.wait_all(reqs)
        assert all((b == sum(q + i for q in range(n))).all() for b in y), (i, y)
    recent = teams[0].planner.recent
    entry = recent[("allreduce", id(x[0]))]
    assert entry.persistent is not None and entry.persistent.task is reqs[0].task
    # another call with the same first buffer is remembered in its place, the last one beside it
    pycoll.wait_all([t.allreduce(a, None) for t, a in zip(teams, x)])
    assert recent[("allreduce", id(x[0]))] is not entry and recent[("allreduce", id(x[0]))].other is entry
    reqs = [t.allreduce(a, b) for t, a, b in zip(teams, x, y)]  # (found there: run again)
    pycoll.wait_all(reqs)
    assert entry.persistent is not None and reqs[0].task is entry.persistent.task
    # calls on other buffers are remembered beside it, up to MAX_REPEATED ...
    full, every = persistent.MAX_REPEATED, persistent.ADMIT_EVERY
    others = [[np.ones(4, np.float32) for _ in teams] for _ in range(full - 1 + every)]
    for k, bufs in enumerate(others):
        pycoll.wait_all([t.allreduce(b) for t, b in zip(teams, bufs)])
        if k == full - 2:
            assert len(recent) == full and entry.persistent is not None
    # ... then one new call in ADMIT_EVERY takes the oldest one's place (its persistent form freed)
    assert len(recent) == full and ("allreduce", id(others[-1][0])) in recent
    assert ("allreduce", id(others[-2][0])) not in recent
    assert ("allreduce", id(x[0])) not in recent and entry.persistent is None
    # a buffer that is not an ndarray is never taken as a repeat
    buf = bytearray(8)
    pycoll.wait_all([t.bcast(buf) for t in teams])
    assert ("bcast", id(buf)) not in teams[0].planner.recent


def test_repeated_calls_that_name_an_algorithm_run_it_as_a_persistent_collective():
    """A loop that names its algorithm gets the repeat's fast path too, with that algorithm; a call
    that names another one is not served by it."""
    n = 2
    teams = pycoll.local_teams(n)
    x = [np.full(8, r + 1.0, np.float32) for r in range(n)]
    y = [np.zeros(8, np.float32) for _ in range(n)]
    for _ in range(4):
        reqs = [t.allreduce(a, b, algorithm="ring") for t, a, b in zip(teams, x, y)]
        pycoll.wait_all(reqs)
        assert all((b == 3.0).all() for b in y)
    entry = teams[0].recent[("allreduce", id(x[0]))]
    assert entry.algorithm == "ring" and entry.persistent is not None
    assert reqs[0].task is entry.persistent.task
    other = [t.allreduce(a, b, algorithm="rd") for t, a, b in zip(teams, x, y)]
    pycoll.wait_all(other)
    assert other[0].task is not entry.persistent.task and all((b == 3.0).all() for b in y)
    # the same buffers with another algorithm are another call, remembered beside the first: a
    # benchmark of one algorithm after another repeats each (it used to be posted anew every time)
    for _ in range(3):
        rd = [t.allreduce(a, b, algorithm="rd") for t, a, b in zip(teams, x, y)]
        pycoll.wait_all(rd)
    head = teams[0].recent[("allreduce", id(x[0]))]
    assert head.algorithm == "rd" and head.persistent is not None and rd[0].task is head.persistent.task
    assert head.other is entry
    ring = [t.allreduce(a, b, algorithm="ring") for t, a, b in zip(teams, x, y)]
    pycoll.wait_all(ring)
    assert ring[0].task is entry.persistent.task and all((b == 3.0).all() for b in y)


def test_a_repeat_whose_ndarray_changed_dtype_in_place_is_checked_again():
    teams = pycoll.local_teams(2)
    bufs = [np.full(2, 1.5, np.float32) for _ in teams]
    for _ in range(4):
        for b in bufs:
            b[:] = 1.5
        pycoll.wait_all([t.allreduce(b) for t, b in zip(teams, bufs)])
        assert all((b == 3.0).all() for b in bufs)
    for r, b in enumerate(bufs):
        b.dtype = np.int32  # the same object, the same bytes, another element type
        b[:] = r + 1
    pycoll.wait_all([t.allreduce(b) for t, b in zip(teams, bufs)])
    assert all(b.dtype == np.int32 and (b == 3).all() for b in bufs), bufs


@pytest.mark.parametrize("change", ["read-only", "strided", "shape (2, 4)", "shape (1, 8)"])
def test_a_repeat_whose_ndarray_changed_flags_or_shape_in_place_is_checked_again(change):
    """The same objects after ``setflags(write=False)`` on the output or strides set so that the
    input is not contiguous: refused as a new call would be (not written, not read as it was
    laid out). After a new shape (same memory, still contiguous): the right values, in memory
    order, whether or not the flags changed with it ((1, 8) is C- and Fortran-contiguous, as
    the 1-D array was)."""
    import warnings

    teams = pycoll.local_teams(2)
    bases = [np.arange(16.0) + 100 * r for r in range(2)]
    xs, ys = [b[:8] for b in bases], [np.zeros(8) for _ in teams]
    # (a new shape after one call: the persistent form is made at the next, of the reshaped arrays)
    for _ in range(1 if change.startswith("shape") else 3):
        pycoll.wait_all([t.allreduce(x, y) for t, x, y in zip(teams, xs, ys)])
    if change == "read-only":
        for y in ys:
            y[:] = -7
            y.setflags(write=False)
        with pytest.raises(pycoll.BufferError, match="read-only"):
            teams[0].allreduce(xs[0], ys[0])
        assert (ys[0] == -7).all()
        return
    if change == "strided":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # (numpy 2.4 deprecates setting strides)
            xs[0].strides = (16,)
        with pytest.raises(pycoll.BufferError, match="not contiguous"):
            teams[0].allreduce(xs[0], ys[0])
        return
    shape = (2, 4) if change == "shape (2, 4)" else (1, 8)
    gathered = [np.zeros(16) for _ in teams]  # (an allgather too: its algorithms slice their blocks)
    pycoll.wait_all([t.allgather(x, g) for t, x, g in zip(teams, xs, gathered)])
    for x, y, g in zip(xs, ys, gathered):
        x.shape = y.shape = shape
        g.shape = (shape[0], 2 * shape[1])
    for _ in range(3):
        for y, g in zip(ys, gathered):
            y[...] = g[...] = 0
        pycoll.wait_all([t.allreduce(x, y) for t, x, y in zip(teams, xs, ys)])
        assert all(np.array_equal(y.reshape(-1), np.arange(0.0, 16.0, 2) + 100) for y in ys), ys
        pycoll.wait_all([t.allgather(x, g) for t, x, g in zip(teams, xs, gathered)])
        assert all(np.array_equal(g.reshape(-1), np.concatenate(bases)[[*range(8), *range(16, 24)]])
                   for g in gathered), gathered


def test_a_remembered_array_cannot_be_reallocated_under_its_persistent_form():
    """The repeat test compares objects, not addresses: ``resize(refcheck=False)`` would move a
    remembered array's memory under the persistent form that points into it. The team keeps a
    weak reference to each, so numpy refuses (an error, not a run on freed memory)."""
    teams = pycoll.local_teams(2)
    xs, ys = [np.ones(4) for _ in teams], [np.zeros(4) for _ in teams]
    for _ in range(2):
        pycoll.wait_all([t.allreduce(x, y) for t, x, y in zip(teams, xs, ys)])
    for arr in (xs[0], ys[0]):
        with pytest.raises(ValueError, match="cannot resize"):
            arr.resize(1000, refcheck=False)
    for t in teams:
        t.recent.clear()  # forgotten: the array is the caller's alone again
    ys[0].resize(1000, refcheck=False)
    assert ys[0].size == 1000
    # a view's base is pinned too: reallocating it would move the view's memory
    bases = [np.zeros(16) for _ in teams]
    for _ in range(2):
        pycoll.wait_all([t.allreduce(b[:8]) for t, b in zip(teams, bases)])
    views = [b[:8] for b in bases]
    for _ in range(2):
        pycoll.wait_all([t.allreduce(v) for t, v in zip(teams, views)])
    with pytest.raises(ValueError, match="cannot resize"):
        bases[0].resize(1000, refcheck=False)


@pytest.mark.parametrize("kind", ["list", "ndarray"])
def test_a_repeat_whose_counts_or_displacements_changed_in_place_is_checked_again(kind):
    """The same counts and displacements objects with new values are a new call (a repeat on the
    old layout put every block at its old place: a wrong result, silently)."""
    n = 2
    teams = pycoll.local_teams(n)
    send = [np.full(1, r + 1.0) for r in range(n)]
    recv = [np.zeros(4 * n) for _ in range(n)]
    counts = [1] * n if kind == "list" else np.ones(n, np.int64)
    displs = list(range(n)) if kind == "list" else np.arange(n)
    for i in range(9):
        for r in range(n):
            displs[r] = r * (1 + i % 3)  # the same object, new values
        for b in recv:
            b[:] = -1
        pycoll.wait_all([t.allgatherv(s, b, counts, displs) for t, s, b in zip(teams, send, recv)])
        want = np.full(4 * n, -1.0)
        want[[displs[r] for r in range(n)]] = np.arange(1.0, n + 1)
        assert all((b == want).all() for b in recv), (i, recv, want)


def test_a_remembered_call_replaced_while_its_run_is_in_flight_still_finishes():
    n = 2
    teams = pycoll.local_teams(n)
    x = [np.full(4, r + 1.0) for r in range(n)]
    y = [np.zeros(4) for _ in range(n)]
    z = [np.zeros(4) for _ in range(n)]
    for _ in range(3):  # remembered, then run as its persistent form
        pycoll.wait_all([t.allreduce(a, b) for t, a, b in zip(teams, x, y)])
    entry = teams[0].recent[("allreduce", id(x[0]))]
    task = entry.persistent.task
    running = teams[0].allreduce(x[0], y[0])  # waits for rank 1, which has not called yet
    assert running.task is task and task.state is pycoll.tasks.task.IN_PROGRESS
    other = teams[0].allreduce(x[0], z[0])  # the same first buffer: remembered in its place
    assert teams[0].recent[("allreduce", id(x[0]))].other is entry and entry.persistent.task is task
    w = [np.zeros(4) for _ in range(n)]
    third = teams[0].allreduce(x[0], w[0])  # one more: the first is forgotten, its run goes on
    assert entry.persistent is None and teams[0].recent[("allreduce", id(x[0]))].other.args[1] is z[0]
    assert task.state is pycoll.tasks.task.IN_PROGRESS
    late = [teams[1].allreduce(x[1], y[1]), teams[1].allreduce(x[1], z[1]), teams[1].allreduce(x[1], w[1])]
    pycoll.wait_all([running, other, third] + late)
    assert all((b == 3.0).all() for out in (y, z, w) for b in out)


def test_calls_that_alternate_two_output_arrays_both_repeat():
    """A program that writes into two arrays by turns (double buffering) repeats both calls; a
    third array pushes the oldest out."""
    n = 2
    teams = pycoll.local_teams(n)
    x = [np.zeros(4, np.float32) for _ in range(n)]
    y = [np.zeros(4, np.float32) for _ in range(n)]
    z = [np.zeros(4, np.float32) for _ in range(n)]
    for i in range(6):
        out = z if i % 2 == 0 else y
        for r in range(n):
            x[r][:] = r + i
        reqs = [t.allreduce(a, b) for t, a, b in zip(teams, x, out)]
        pycoll.wait_all(reqs)
        assert all((b == 2 * i + 1).all() for b in out), (i, out)
    recent = teams[0].recent
    head = recent[("allreduce", id(x[0]))]
    assert head.args[1] is y[0] and head.other.args[1] is z[0] and head.other.other is None
    assert reqs[0].task is head.persistent.task and head.other.persistent is not None
    w = [np.zeros(4, np.float32) for _ in range(n)]
    dropped = head.other
    pycoll.wait_all([t.allreduce(a, b) for t, a, b in zip(teams, x, w)])
    head = recent[("allreduce", id(x[0]))]
    assert head.args[1] is w[0] and head.other.args[1] is y[0] and dropped.persistent is None
    for t in teams:
        t.close()
    assert recent.nbytes == 0 and not recent


def test_a_new_call_under_a_key_makes_room_by_dropping_that_keys_oldest_first(monkeypatch):
    """Under a key the new call replaces the oldest of its two (whose bytes are then free) before any
    other key's calls are forgotten for room."""
    monkeypatch.setattr(persistent, "MAX_REPEATED_BYTES", 8 << 20)
    recent = persistent.RecentCalls()
    x = np.ones(1 << 17)  # 1 MiB
    outs = [np.ones(3 << 17) for _ in range(3)]  # 3 MiB each
    key = ("allreduce", id(x))
    for out in outs:
        assert recent.admits(key, (x, out))
        recent.add(key, (x, out), (x.dtype, out.dtype), lambda: None)
    head = recent[key]
    assert head.args[1] is outs[2] and head.other.args[1] is outs[1] and recent.nbytes == 8 << 20
    big = np.ones(1 << 19)  # 4 MiB under another key: the oldest key goes, both its calls
    recent.add(("bcast", id(big)), (big,), (big.dtype,), lambda: None)
    assert key not in recent and recent.nbytes == 4 << 20


def test_remembered_calls_hold_at_most_max_repeated_bytes_of_buffers(monkeypatch):
    """A remembered call keeps its buffers alive: the table holds at most MAX_REPEATED_BYTES of
    them (whole bases of views counted), the oldest making room, and a call whose buffers alone
    hold more is not remembered (so a dropped large array is freed)."""
    monkeypatch.setattr(persistent, "MAX_REPEATED_BYTES", 64 << 10)  # 64 KiB
    teams = pycoll.local_teams(2)

    def call(xs):
        pycoll.wait_all([t.allreduce(x, None) for t, x in zip(teams, xs)])

    small = [[np.ones(1024) for _ in teams] for _ in range(10)]  # 8 KiB each
    for xs in small:
        call(xs)
    recent = teams[0].recent
    assert 0 < recent.nbytes <= 64 << 10 and len(recent) == 8  # the oldest two made room
    assert ("allreduce", id(small[0][0])) not in recent and ("allreduce", id(small[-1][0])) in recent
    big = [np.ones(1 << 14)[: 1 << 10] for _ in teams]  # a view of 128 KiB: its base counts
    call(big)
    assert ("allreduce", id(big[0])) not in recent and recent.nbytes <= 64 << 10
    assert persistent.held_bytes((big[0], None, 3)) == 128 << 10
    for t in teams:
        t.close()
    assert recent.nbytes == 0 and not recent
