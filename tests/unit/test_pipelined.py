"""PipelinedSchedule: depth, slot reuse, fragment ordering modes, FRAGMENT_COMPLETED."""

import pytest

from pycoll import Context, Event, PipelinedSchedule, PipelineOrder, Schedule
from tests.conftest import Manual


class Pipe:
    """A pipeline of ``n`` fragments, each a chain step0 -> step1, with Manual tasks the test finishes."""

    def __init__(self, n, depth, order):
        self.log = []  # (event, fragment, step)
        self.made = 0
        self.ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
        self.pipe = PipelinedSchedule(n, self.make, self.setup, depth=depth, order=order, name="pipe")
        self.done = []
        self.pipe.subscribe(Event.FRAGMENT_COMPLETED, None, lambda lis, src, frag: self.done.append(frag))

    def make(self, slot):
        self.made += 1
        sched = Schedule(name=f"slot{slot}")
        a = sched.add(Manual("s0"))
        sched.add(Manual("s1"), after=a)
        for step, task in enumerate(sched.tasks):
            task.subscribe(Event.STARTED, None, lambda lis, src, data, step=step, s=sched:
                           self.log.append(("start", s.frag, step)))
        return sched

    def setup(self, sched, frag):
        sched.frag = frag

    def running(self):
        return [(t.parent.frag, i) for t in self.all_tasks() for i in [t.parent.tasks.index(t)]
                if t.state.name == "IN_PROGRESS"]

    def all_tasks(self):
        return [t for slot in self.pipe.tasks for t in slot.tasks]

    def finish(self, frag, step):
        for slot in self.pipe.tasks:
            if slot.frag == frag and slot.tasks[step].state.name == "IN_PROGRESS":
                slot.tasks[step].finish()
                self.ctx.progress()
                self.ctx.progress()
                return
        raise AssertionError(f"fragment {frag} step {step} is not running: {self.running()}")


def test_parallel_depth_and_slot_reuse():
    p = Pipe(5, depth=2, order=PipelineOrder.PARALLEL)
    req = p.ctx.submit(p.pipe)
    assert p.made == 2
    assert sorted(p.running()) == [(0, 0), (1, 0)]
    p.finish(1, 0)
    p.finish(1, 1)  # fragment 1 finishes first: its slot takes fragment 2
    assert p.done == [1]
    assert sorted(p.running()) == [(0, 0), (2, 0)]
    for frag in (0, 2, 3, 4):
        p.finish(frag, 0)
        p.finish(frag, 1)
    req.wait()
    assert sorted(p.done) == [0, 1, 2, 3, 4]
    assert p.made == 2 and p.pipe.fragments_launched == 5


def test_ordered_waits_for_previous_fragment_to_start_each_step():
    p = Pipe(3, depth=3, order=PipelineOrder.ORDERED)
    p.ctx.submit(p.pipe)
    # all three fragments may start step 0 (in order), none step 1 yet
    assert [e for e in p.log if e[0] == "start"] == [("start", 0, 0), ("start", 1, 0), ("start", 2, 0)]
    p.finish(1, 0)  # fragment 1 step 0 done, but its step 1 must wait for fragment 0's step 1 to start
    assert ("start", 1, 1) not in p.log
    p.finish(0, 0)
    starts = [e for e in p.log if e[0] == "start" and e[2] == 1]
    assert starts == [("start", 0, 1), ("start", 1, 1)]


def test_sequential_waits_for_previous_fragment_to_complete_each_step():
    p = Pipe(3, depth=3, order=PipelineOrder.SEQUENTIAL)
    req = p.ctx.submit(p.pipe)
    assert sorted(p.running()) == [(0, 0)]
    p.finish(0, 0)
    assert sorted(p.running()) == [(0, 1), (1, 0)]
    p.finish(1, 0)
    assert sorted(p.running()) == [(0, 1), (2, 0)]  # fragment 1 step 1 waits for fragment 0 step 1
    p.finish(0, 1)
    assert sorted(p.running()) == [(1, 1), (2, 0)]
    p.finish(1, 1)
    p.finish(2, 0)
    p.finish(2, 1)
    req.wait()
    assert p.done == [0, 1, 2]


def test_sequential_with_slot_reuse_runs_all_in_order():
    p = Pipe(6, depth=2, order=PipelineOrder.SEQUENTIAL)
    req = p.ctx.submit(p.pipe)
    for frag in range(6):
        p.finish(frag, 0)
        p.finish(frag, 1)
    req.wait()
    assert p.done == list(range(6))
    step0 = [e[1] for e in p.log if e[2] == 0]
    assert step0 == list(range(6))


def test_zero_fragments_and_bad_arguments_and_repost():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    assert ctx.submit(PipelinedSchedule(0, lambda s: Schedule())).wait() is None
    with pytest.raises(ValueError):
        PipelinedSchedule(-1, lambda s: Schedule())
    with pytest.raises(ValueError):
        PipelinedSchedule(3, lambda s: Schedule(), depth=0)
    with pytest.raises(TypeError, match="make_fragment"):
        PipelinedSchedule(3, lambda s: Schedule()).add(Schedule())
    p = Pipe(3, depth=2, order=PipelineOrder.PARALLEL)
    for _ in range(2):
        req = p.ctx.submit(p.pipe)
        for frag in range(3):
            p.finish(frag, 0)
            p.finish(frag, 1)
        req.wait()
        p.pipe.reset()
    assert p.made == 2 and sorted(p.done) == [0, 0, 1, 1, 2, 2]


def test_failing_fragment_fails_pipeline():
    ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    from tests.conftest import Boom

    def make(slot):
        return Schedule([Boom("frag-boom")])

    req = ctx.submit(PipelinedSchedule(4, make, depth=2))
    with pytest.raises(RuntimeError, match="frag-boom"):
        req.wait()
