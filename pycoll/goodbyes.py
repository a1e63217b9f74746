"""The process's goodbyes: at interpreter exit, and on an exception nobody caught, everything
registered here says that its rank left (a mapped segment's control block, a team's liveness
connections), so peers learn it at once instead of waiting for a timeout.

One set of hooks per process, installed at the first registration (a forked child installs its
own and never speaks for its parent). An interactive interpreter shows exceptions at its prompt
and goes on: there an exception is no leaving. Exit handlers registered before the first
registration run after the rank has said it left.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any, Protocol, Tuple


class Leaving(Protocol):
    """What can say that this rank left: how (its own code) and why."""

    def leave(self, how: int, why: str = "") -> None: ...


#: Each registered object, and its codes for (exited, raised).
_live: weakref.WeakKeyDictionary[Any, Tuple[int, int]] = weakref.WeakKeyDictionary()
_hooked = 0  # the process that installed the hooks (0: none)


def _say(raised: bool, why: str) -> None:
    for obj, codes in list(_live.items()):
        obj.leave(codes[1] if raised else codes[0], why)


def watch(obj: Leaving, exited: int, raised: int) -> None:
    """Have ``obj`` say its rank left (``obj.leave(exited)`` at exit, ``obj.leave(raised, text)``
    on an uncaught exception) until :func:`unwatch`; held weakly."""
    global _hooked
    _live[obj] = (exited, raised)
    if _hooked == os.getpid():
        return
    _hooked = os.getpid()
    atexit.register(_say, False, "")
    previous = sys.excepthook

    def hook(kind: type, value: BaseException, tb: Any) -> None:
        try:
            if not (hasattr(sys, "ps1") or sys.flags.interactive):  # a prompt goes on after it
                try:
                    text = f"{kind.__name__}: {value}"
                except Exception:  # noqa: BLE001 - a broken __str__ must not stop the goodbye
                    text = kind.__name__
                _say(True, text)
        finally:
            previous(kind, value, tb)

    sys.excepthook = hook


def unwatch(obj: Leaving) -> None:
    """``obj`` is closed: nothing more to say for it."""
    _live.pop(obj, None)
