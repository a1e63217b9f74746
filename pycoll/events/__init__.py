"""Events and the publish/subscribe manager that tasks are built on (UCC's event manager)."""

from pycoll.events.manager import Event, EventManager, Subscription, event_mask

__all__ = ["Event", "EventManager", "Subscription", "event_mask"]
