"""Publish/subscribe between tasks.

An :class:`EventManager` publishes events; any object may listen to them. A listener subscribes to
one event of one manager with a handler ``handler(listener, source, data)``; when the handler is
omitted the listener's own ``handlers[event]`` table is used (looked up at delivery time, as UCC
does with ``task->handlers[event]``).

Changing subscriptions while a notification is being delivered (an open question in the UCC
slides) is answered here as follows:

* a listener subscribed during a delivery of an event is not called by that delivery; it receives
  the next notification of that event;
* a listener unsubscribed during a delivery is not called by that delivery if its turn has not come
  yet (an unsubscribe takes effect immediately), and a handler may unsubscribe itself;
* a handler may notify again (on the same manager or another): nested deliveries follow the same
  rules.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Optional

Handler = Callable[[Any, "EventManager", Any], None]


class Event(enum.IntEnum):
    """Events a task publishes."""

    PROGRESS = 0
    """A task moved forward (a schedule publishes it each time one of its tasks finishes)."""
    STARTED = 1
    """A task was posted by the engine (pipelines with ORDERED fragments wait on it)."""
    COMPLETED = 2
    """A task finished successfully."""
    ERROR = 3
    """A task failed; ``source.error`` holds the exception."""
    CANCELED = 4
    """A task was canceled (``source.error`` holds the cause when a dependency failed)."""
    FRAGMENT_COMPLETED = 5
    """A pipelined schedule finished one fragment; ``data`` is the fragment's index."""


N_EVENTS = len(Event)


class Subscription:
    """One (listener, handler) pair subscribed to one event of one manager."""

    __slots__ = ("listener", "handler", "active")

    def __init__(self, listener: Any, handler: Optional[Handler]) -> None:
        self.listener = listener
        self.handler = handler
        self.active = True

    def __repr__(self) -> str:
        return f"Subscription({self.listener!r}, active={self.active})"


class EventManager:
    """Publishes events to subscribed listeners.

    Listeners are kept per event in subscription order; delivery follows that order.
    """

    __slots__ = ("subscriptions",)

    def __init__(self) -> None:
        #: Per event, its subscriptions in delivery order: a list made on the first subscribe (most
        #: tasks have one or two listeners), ``None`` before. Read-only outside this class: the engine
        #: reads it to skip a notification nobody hears; change it with subscribe/unsubscribe.
        self.subscriptions: Optional[list] = None

    def subscribe(self, event: Event, listener: Any, handler: Optional[Handler] = None) -> Subscription:
        """Call ``handler(listener, self, data)`` each time ``event`` is notified.

        Without a handler, ``listener.handlers[event]`` is called the same way. Returns the
        subscription, which ``unsubscribe`` also accepts.
        """
        if handler is None and not hasattr(listener, "handlers"):
            raise TypeError(
                f"subscribe({Event(event).name}): {listener!r} has no handlers table; pass a handler"
            )
        subs = self.subscriptions
        if subs is None:
            subs = self.subscriptions = [None] * N_EVENTS
        sub = Subscription(listener, handler)
        lst = subs[event]
        if lst is None:
            subs[event] = [sub]
        else:
            lst.append(sub)
        return sub

    def subscribe_first(self, event: Event, listener: Any, handler: Optional[Handler] = None) -> Subscription:
        """Like :meth:`subscribe`, but delivered before the listeners already subscribed (a tracer
        takes a task's finish time before its dependants run)."""
        sub = self.subscribe(event, listener, handler)
        lst = self.subscriptions[event]
        lst.insert(0, lst.pop())
        return sub

    def unsubscribe(self, event: Event, listener: Any, handler: Optional[Handler] = None) -> bool:
        """Remove a subscription: a :class:`Subscription`, or the first one of ``listener``
        (and ``handler`` if given) to ``event``. Returns whether one was removed."""
        subs = self.subscriptions
        lst = subs[event] if subs is not None else None
        if not lst:
            return False
        for i, sub in enumerate(lst):
            if sub is listener or (
                sub.listener is listener and (handler is None or sub.handler == handler)
            ):
                sub.active = False
                del lst[i]
                return True
        return False

    def listeners(self, event: Event) -> list:
        """The listeners currently subscribed to ``event``, in delivery order."""
        subs = self.subscriptions
        lst = subs[event] if subs is not None else None
        return [s.listener for s in lst] if lst else []

    def notify(self, event: Event, data: Any = None) -> None:
        """Deliver ``event`` to its listeners (see the module docstring for changes during delivery)."""
        subs = self.subscriptions
        if subs is None:
            return
        lst = subs[event]
        if not lst:
            return
        for sub in lst[:] if len(lst) > 1 else (lst[0],):
            if sub.active:
                handler = sub.handler
                if handler is None:
                    handler = sub.listener.handlers[event]
                handler(sub.listener, self, data)
