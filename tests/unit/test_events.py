"""EventManager: delivery order, handler tables, and changes of subscriptions during delivery."""

import pytest

from pycoll.events import Event, EventManager, event_mask


class Listener:
    def __init__(self, log, name):
        self.log = log
        self.name = name
        self.handlers = {e: self.record for e in Event}

    @staticmethod
    def record(listener, source, data):
        listener.log.append((listener.name, data))


def test_delivery_in_subscription_order_with_data():
    em, log = EventManager(), []
    a, b = Listener(log, "a"), Listener(log, "b")
    em.subscribe(Event.COMPLETED, a)
    em.subscribe(Event.COMPLETED, b)
    em.notify(Event.COMPLETED, 7)
    em.notify(Event.PROGRESS)  # nobody listens
    assert log == [("a", 7), ("b", 7)]
    assert em.listeners(Event.COMPLETED) == [a, b]


def test_explicit_handler_and_handler_table_looked_up_at_delivery():
    em, log = EventManager(), []
    a = Listener(log, "a")
    em.subscribe(Event.ERROR, a)
    a.handlers[Event.ERROR] = lambda lis, src, data: log.append(("changed", src is em))
    em.subscribe(Event.COMPLETED, None, lambda lis, src, data: log.append(("fn", lis)))
    em.notify(Event.ERROR)
    em.notify(Event.COMPLETED)
    assert log == [("changed", True), ("fn", None)]


def test_subscribe_without_handler_needs_table():
    with pytest.raises(TypeError, match="handlers"):
        EventManager().subscribe(Event.COMPLETED, object())


def test_subscribe_during_delivery_joins_next_notification():
    em, log = EventManager(), []
    late = Listener(log, "late")

    def first(lis, src, data):
        log.append(("first", data))
        if data == 1:
            em.subscribe(Event.COMPLETED, late)

    em.subscribe(Event.COMPLETED, None, first)
    em.notify(Event.COMPLETED, 1)
    assert log == [("first", 1)]
    em.notify(Event.COMPLETED, 2)
    assert log == [("first", 1), ("first", 2), ("late", 2)]


def test_unsubscribe_during_delivery_takes_effect_at_once():
    em, log = EventManager(), []
    victim = Listener(log, "victim")

    def killer(lis, src, data):
        log.append(("killer", data))
        assert em.unsubscribe(Event.COMPLETED, victim)

    em.subscribe(Event.COMPLETED, None, killer)
    em.subscribe(Event.COMPLETED, victim)
    em.notify(Event.COMPLETED, 1)
    assert log == [("killer", 1)]
    assert em.listeners(Event.COMPLETED) == [None]


def test_handler_unsubscribes_itself_one_shot():
    em, log = EventManager(), []
    sub = None

    def once(lis, src, data):
        log.append(data)
        em.unsubscribe(Event.COMPLETED, sub)

    sub = em.subscribe(Event.COMPLETED, None, once)
    em.notify(Event.COMPLETED, 1)
    em.notify(Event.COMPLETED, 2)
    assert log == [1]
    assert not em.unsubscribe(Event.COMPLETED, sub)


def test_nested_notify_follows_the_same_rules():
    em, log = EventManager(), []

    def outer(lis, src, data):
        log.append(("outer", data))
        if data == 0:
            em.notify(Event.COMPLETED, 1)

    em.subscribe(Event.COMPLETED, None, outer)
    em.subscribe(Event.COMPLETED, None, lambda lis, src, data: log.append(("second", data)))
    em.notify(Event.COMPLETED, 0)
    assert log == [("outer", 0), ("outer", 1), ("second", 1), ("second", 0)]


def test_unsubscribe_by_listener_and_handler():
    em = EventManager()
    h1 = lambda *a: None  # noqa: E731
    h2 = lambda *a: None  # noqa: E731
    em.subscribe(Event.COMPLETED, "x", h1)
    em.subscribe(Event.COMPLETED, "x", h2)
    assert em.unsubscribe(Event.COMPLETED, "x", h2)
    assert not em.unsubscribe(Event.COMPLETED, "x", h2)
    assert em.unsubscribe(Event.COMPLETED, "x")
    assert em.listeners(Event.COMPLETED) == []
    assert not em.unsubscribe(Event.ERROR, "x")


def test_one_subscription_for_several_events():
    em, log = EventManager(), []
    mask = event_mask(Event.COMPLETED, Event.ERROR)
    sub = em.subscribe_mask(mask, None, lambda lis, src, data: log.append(data))
    em.notify(Event.COMPLETED, "c")
    em.notify(Event.CANCELED, "x")  # not covered
    em.notify(Event.ERROR, "e")
    assert log == ["c", "e"]
    assert em.unsubscribe(Event.COMPLETED, sub)  # only that event
    assert sub.active and em.listeners(Event.COMPLETED) == [] and em.listeners(Event.ERROR) == [None]
    em.notify(Event.COMPLETED, "c2")
    em.notify(Event.ERROR, "e2")
    assert log == ["c", "e", "e2"]
    assert em.unsubscribe(Event.ERROR, sub)
    assert not sub.active and em.subscriptions == [] and em.listened == 0


def test_one_two_and_back_to_one_subscription_keep_order():
    em, log = EventManager(), []
    a = em.subscribe(Event.COMPLETED, None, lambda *args: log.append("a"))
    first = em.subscribe_first(Event.COMPLETED, None, lambda *args: log.append("first"))
    em.subscribe(Event.COMPLETED, None, lambda *args: log.append("b"))
    em.notify(Event.COMPLETED)
    assert log == ["first", "a", "b"]
    assert em.unsubscribe(Event.COMPLETED, first) and em.unsubscribe(Event.COMPLETED, a)
    assert len(em.subscriptions) == 1
    log.clear()
    em.notify(Event.COMPLETED)
    assert log == ["b"]


def test_unsubscribed_during_delivery_of_one_of_its_events():
    em, log = EventManager(), []
    victim = Listener(log, "victim")

    def killer(lis, src, data):
        em.unsubscribe(Event.ERROR, victim)

    em.subscribe(Event.ERROR, None, killer)
    em.subscribe_mask(event_mask(Event.ERROR, Event.COMPLETED), victim)
    em.notify(Event.ERROR, 1)
    em.notify(Event.COMPLETED, 2)
    assert log == [("victim", 2)]
