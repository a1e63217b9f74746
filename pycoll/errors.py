"""Exceptions raised by pycoll. Every error a user can catch derives from :class:`PycollError`."""

from __future__ import annotations

import builtins
from typing import Any, Optional, Sequence


class PycollError(Exception):
    """Base class of every pycoll error."""


class TimeoutError(PycollError, builtins.TimeoutError):  # noqa: A001 - the public name is fixed
    """A task or collective did not finish in time.

    ``task`` is the task that timed out, ``waiting_on`` the unfinished tasks inside it (for a
    schedule: the operations still in progress, each naming its peer where it has one) and
    ``seconds`` the limit that ran out (None when not known).
    """

    def __init__(self, message: str, task: Any = None, waiting_on: Sequence[Any] = (),
                 seconds: Optional[float] = None) -> None:
        super().__init__(message)
        self.task = task
        self.waiting_on = list(waiting_on)
        self.seconds = seconds


class CanceledError(PycollError):
    """The request's task was canceled before it finished."""


class TransportError(PycollError):
    """A transport failed: a peer vanished, a message was malformed, a library call failed."""


class PeerLostError(TransportError):
    """A peer left while this rank waited for it: its process died, exited, raised an uncaught
    exception or closed the team. ``rank`` and ``pid`` name it, ``how`` says how it left (the
    exception's text when it raised one)."""

    rank, pid, how = -1, 0, ""  # (for subclasses built from the text alone)

    def __init__(self, message: str, rank: int = -1, pid: int = 0, how: str = "") -> None:
        super().__init__(message)
        self.rank, self.pid, self.how = rank, pid, how


class RevokedError(TransportError):
    """The team was revoked (``team.revoke()`` on some rank, usually after a failure): every
    pending and later call on it raises this on every rank. ``rank`` names the rank that revoked
    it. The survivors go on with ``team.shrink()`` (see :mod:`pycoll.recovery`)."""

    def __init__(self, message: str, rank: int = -1) -> None:
        super().__init__(message)
        self.rank = rank


class ClosedError(PycollError):
    """A call on a team after its ``close()`` (or on a ``pycoll.mpi.Comm`` after ``Free()``), or on
    a persistent collective of such a team: refused before anything is sent."""


class MismatchError(PycollError):
    """The ranks of a team called different collectives, or the same one with arguments that must
    agree and do not (count, dtype, op, root). The message names each rank's call side by side,
    e.g. ``rank 0: allreduce 100 x float32 sum; rank 1: allreduce 101 x float32 sum``."""


class AuthError(PycollError):
    """Something pycoll read (a store entry, a connection's hello) fails the job key's MAC:
    written by a process outside the job (or of another job), or tampered with. pycoll drops
    it and logs it, and never acts on it (see docs/guide/security.md)."""


class ThreadError(MismatchError):
    """Untagged collectives of one team were posted from two threads at once: their order, which
    matches them across ranks, may differ from rank to rank (MPI calls it erroneous), so their data
    may pair wrongly. The team takes no more calls, on every rank. Give each thread's collectives a
    ``tag=``, or each thread a team of its own, or let one thread post at a time (its collectives
    finished before another thread posts)."""


class ConfigError(PycollError, ValueError):
    """A setting (a ``PYCOLL_*`` variable or an argument naming one) could not be parsed."""


class BufferError(PycollError, ValueError):  # noqa: A001 - pycoll.BufferError, a ValueError
    """A buffer cannot be used as given (non-contiguous, read-only where written, a size that does
    not fit the call, ...): raised by the argument checks, before anything is sent."""


#: How a peer that left after it found its team's calls out of step is said to have left (its
#: text follows): a transport that loses such a peer raises MismatchError, not PeerLostError.
OUT_OF_STEP_WORDS = "left after it found the team's calls out of step:"
