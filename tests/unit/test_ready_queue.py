"""The engine's ready queue: priority order, first in first out within a priority."""

from pycoll.engine import ready
from pycoll.engine.ready import ReadyQueue


def test_priority_order_and_fifo_within_a_priority():
    q = ReadyQueue()
    assert not q
    for i in range(30):
        q.push(i, i % 3)
    assert q and q.size() == 30 and q.head() == 0
    out = [q.pop() for _ in range(30)]
    assert out == sorted(range(30), key=lambda i: (i % 3, i))
    assert not q and q.size() == 0


def test_more_urgent_work_queued_meanwhile_goes_first():
    q = ReadyQueue()
    q.push("late", 5)
    q.push("later", 5)
    assert q.pop() == "late"
    q.push("urgent", -1)
    assert [q.pop(), q.pop()] == ["urgent", "later"]


def test_idle_buckets_are_dropped_past_the_limit(monkeypatch):
    monkeypatch.setattr(ready, "MAX_IDLE_BUCKETS", 8)
    q = ReadyQueue()
    q.push("kept", 1000)
    for p in range(50):
        q.push(p, p)
        assert q.pop() == p
    assert len(q.buckets) <= 9 and q.pop() == "kept"
