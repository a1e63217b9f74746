"""The message key of a collective in flight: where the status questions, the liveness words and
the planner's waiting reports find a collective's place in its team's order (one function, so the
three cannot drift)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.tasks.task import Task


def key_of(task: Task, waiting: Sequence[Task]) -> Optional[tuple]:
    """The message key of the collective ``task`` is (or wraps: the agreement check), from the
    first of it and the tasks ``waiting`` (those it waits on) that has a channel: ``("c", k)`` or
    ``("u", tag, k)``; None where none has."""
    for t in (task, getattr(task, "task", None), *waiting):
        key = getattr(getattr(getattr(t, "args", None), "channel", None), "key", None)
        if key is None:
            key = getattr(getattr(t, "channel", None), "key", None)
        if isinstance(key, tuple) and key and key[0] == "c" and len(key) >= 2:
            return key[:2]
        if isinstance(key, tuple) and key and key[0] == "u" and len(key) >= 3:
            return key[:3]
    return None
