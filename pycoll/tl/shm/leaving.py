"""How a rank tells the peers on its host's shared segments that it left.

A rank that leaves writes how (and why) into its control block of every segment it has mapped
(``ShmSegment.leave``): at interpreter exit, on an exception nobody caught (a ``sys.excepthook``
that then calls the previous one), when it closes a team, and when a collective fails on it. Its
peers, waiting for it, raise ``pycoll.PeerLostError`` at once instead of waiting for the timeout,
even while its process lives on (inside ``MPI_Finalize``, or its launcher).

Limits: exit handlers registered before the first segment run after the rank has said it left
(a collective they run fails on the peers); mpi4py finalizes MPI after every Python exit handler,
so MPI itself is unaffected. An interactive interpreter shows exceptions at its prompt and goes
on: there, an exception does not count as leaving. A forked child never speaks for its parent.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any, Protocol

#: How a rank left (PC_LEFT_* of native/pycoll_native.h).
LEFT_EXITED, LEFT_RAISED, LEFT_CLOSED, LEFT_FAILED, LEFT_REVOKED = 1, 2, 3, 4, 5
#: A rank whose collective failed because the ranks' calls differ (its peers raise MismatchError).
LEFT_MISMATCH = 6
#: Bytes of the reason a rank gives (PC_LEFT_WHY, its NUL included).
LEFT_WHY_BYTES = 48
#: How a peer's error says it.
LEFT_TEXT = {LEFT_EXITED: "exited", LEFT_RAISED: "raised", LEFT_CLOSED: "closed its team",
             LEFT_FAILED: "failed:", LEFT_REVOKED: "revoked the team:",
             LEFT_MISMATCH: "found that the ranks' calls differ:"}


class Leaving(Protocol):
    """What can say that this rank left (a mapped segment)."""

    def leave(self, how: int = LEFT_EXITED, why: str = "") -> None: ...


_live: weakref.WeakSet = weakref.WeakSet()  # the segments this process has mapped
_watching = 0  # the process that installed the handlers (0: none)


def leave_all(how: int, why: str) -> None:
    """Every live segment of this process says it left."""
    for seg in list(_live):
        seg.leave(how, why)


def watch(seg: Leaving) -> None:
    """Say ``seg``'s rank left when this process exits or an uncaught exception ends it (the
    handlers are installed once per process; a forked child installs its own)."""
    global _watching
    _live.add(seg)
    if _watching == os.getpid():
        return
    _watching = os.getpid()
    atexit.register(leave_all, LEFT_EXITED, "")
    previous = sys.excepthook

    def hook(kind: type, value: BaseException, tb: Any) -> None:
        try:
            if not (hasattr(sys, "ps1") or sys.flags.interactive):  # a prompt goes on after it
                try:
                    text = f"{kind.__name__}: {value}"
                except Exception:  # noqa: BLE001 - a broken __str__ must not stop the marker
                    text = kind.__name__
                leave_all(LEFT_RAISED, text)
        finally:
            previous(kind, value, tb)

    sys.excepthook = hook


def unwatch(seg: Leaving) -> None:
    """``seg`` is closed: nothing more to say for it."""
    _live.discard(seg)
