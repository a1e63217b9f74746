"""How a rank tells the peers on its host's shared segments that it left.

A rank that leaves writes how (and why) into its control block of every segment it has mapped
(``ShmSegment.leave``): at interpreter exit, on an exception nobody caught (a ``sys.excepthook``
that then calls the previous one), when it closes a team, and when a collective fails on it. Its
peers, waiting for it, raise ``pycoll.PeerLostError`` at once instead of waiting for the timeout,
even while its process lives on (inside ``MPI_Finalize``, or its launcher).

The hooks are :mod:`pycoll.goodbyes`' (with their limits); mpi4py finalizes MPI after every
Python exit handler, so MPI itself is unaffected.
"""

from __future__ import annotations

from typing import Any

from pycoll import goodbyes

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


def watch(seg: Any) -> None:
    """Say ``seg``'s rank left when this process exits or an uncaught exception ends it
    (:mod:`pycoll.goodbyes`)."""
    goodbyes.watch(seg, LEFT_EXITED, LEFT_RAISED)


def unwatch(seg: Any) -> None:
    """``seg`` is closed: nothing more to say for it."""
    goodbyes.unwatch(seg)
