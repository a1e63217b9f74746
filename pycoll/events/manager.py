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
from typing import Any, Callable, List, Optional, Union

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


def event_mask(*events: Event) -> int:
    """The bit set of ``events``, for :meth:`EventManager.subscribe_mask`."""
    mask = 0
    for event in events:
        mask |= 1 << event
    return mask


class Subscription:
    """One listener (with its handler, or its handler table) subscribed to some events of one manager.

    ``events`` is the bit set of the events it still receives (``1 << event``); unsubscribing from
    an event clears that bit, and a subscription with no bit left is removed.
    """

    __slots__ = ("listener", "handler", "events")

    def __init__(self, listener: Any, handler: Optional[Handler], events: int) -> None:
        self.listener = listener
        self.handler = handler
        self.events = events

    @property
    def active(self) -> bool:
        """Whether it still receives any event."""
        return self.events != 0

    def __repr__(self) -> str:
        names = [e.name for e in Event if self.events >> e & 1]
        return f"Subscription({self.listener!r}, {'|'.join(names) or 'inactive'})"


class EventManager:
    """Publishes events to subscribed listeners.

    A manager keeps its subscriptions in subscription order (a subscription may cover several
    events: a dependency listens to COMPLETED, ERROR and CANCELED through one object); each event is
    delivered in that order to the subscriptions that cover it. Most tasks have one listener, so the
    one subscription is kept as it is, and a list only from the second: a schedule of 200,000 tasks
    is built about 1.3x faster without a list per task for the garbage collector to walk.
    """

    __slots__ = ("_subs", "listened")

    def __init__(self) -> None:
        # None, the one Subscription, or a list of them in delivery order
        self._subs: Union[None, Subscription, List[Subscription]] = None
        #: The bit set (``1 << event``) of events somebody listens to: the engine reads it to skip a
        #: notification nobody hears. Read-only outside this class.
        self.listened = 0

    @property
    def subscriptions(self) -> List[Subscription]:
        """The subscriptions in delivery order (a new list)."""
        subs = self._subs
        return [] if subs is None else [subs] if subs.__class__ is Subscription else list(subs)

    def subscribe(self, event: Event, listener: Any, handler: Optional[Handler] = None) -> Subscription:
        """Call ``handler(listener, self, data)`` each time ``event`` is notified.

        Without a handler, ``listener.handlers[event]`` is called the same way. Returns the
        subscription, which ``unsubscribe`` also accepts.
        """
        return self.subscribe_mask(1 << event, listener, handler)

    def subscribe_mask(self, events: int, listener: Any, handler: Optional[Handler] = None) -> Subscription:
        """Like :meth:`subscribe`, for each event in the bit set ``events`` (see :func:`event_mask`)
        through one subscription. The handler does not receive the event: give none (the
        listener's table is indexed by the event) or one that reads it from the source's state."""
        if handler is None and not hasattr(listener, "handlers"):
            raise TypeError(f"subscribe: {listener!r} has no handlers table; pass a handler")
        sub = Subscription(listener, handler, events)
        subs = self._subs
        if subs is None:
            self._subs = sub
        elif subs.__class__ is Subscription:
            self._subs = [subs, sub]
        else:
            subs.append(sub)
        self.listened |= events
        return sub

    def subscribe_first(self, event: Event, listener: Any, handler: Optional[Handler] = None) -> Subscription:
        """Like :meth:`subscribe`, but delivered before the listeners already subscribed (a tracer
        takes a task's finish time before its dependants run)."""
        sub = self.subscribe(event, listener, handler)
        subs = self._subs
        if subs.__class__ is not Subscription:
            subs.insert(0, subs.pop())
        return sub

    def unsubscribe(self, event: Event, listener: Any, handler: Optional[Handler] = None) -> bool:
        """Stop delivering ``event`` to a subscription: a :class:`Subscription`, or the first one of
        ``listener`` (and ``handler`` if given) to ``event``. Returns whether one was changed."""
        subs = self.subscriptions
        bit = 1 << event
        for i, sub in enumerate(subs):
            if sub.events & bit and (sub is listener or (
                    sub.listener is listener and (handler is None or sub.handler == handler))):
                sub.events &= ~bit
                if not sub.events:
                    del subs[i]
                listened = 0
                for other in subs:
                    listened |= other.events
                self.listened = listened
                self._subs = None if not subs else subs[0] if len(subs) == 1 else subs
                return True
        return False

    def listeners(self, event: Event) -> list:
        """The listeners currently subscribed to ``event``, in delivery order."""
        if not self.listened >> event & 1:
            return []
        return [s.listener for s in self.subscriptions if s.events >> event & 1]

    def notify(self, event: Event, data: Any = None) -> None:
        """Deliver ``event`` to its listeners (see the module docstring for changes during delivery)."""
        bit = 1 << event
        if not self.listened & bit:
            return
        subs = self._subs
        if subs.__class__ is Subscription:  # one listener, and it listens to this event
            handler = subs.handler
            if handler is None:
                handler = subs.listener.handlers[event]
            handler(subs.listener, self, data)
            return
        for sub in subs[:]:
            if sub.events & bit:
                handler = sub.handler
                if handler is None:
                    handler = sub.listener.handlers[event]
                handler(sub.listener, self, data)
