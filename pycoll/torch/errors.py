"""pycoll's errors as torch.distributed users catch them: ``DistBackendError`` (a ``RuntimeError``,
what NCCL's and gloo's failures raise) that are pycoll's errors too, with pycoll's text and
attributes: ranks that disagree, a peer that left, a revoked team, a timeout, a transport failure."""

from __future__ import annotations

import torch.distributed as dist

from pycoll.errors import (
    MismatchError,
    PeerLostError,
    PycollError,
    RevokedError,
    TimeoutError,
    TransportError,
)


class InvalidArgumentError(ValueError, RuntimeError):
    """A call's arguments failed the backend's checks before anything was sent: a ``ValueError``
    (pycoll's way) that is a ``RuntimeError`` too (what gloo raises for them)."""


class MismatchDistError(MismatchError, dist.DistBackendError):
    """Ranks called a collective with arguments that must agree and do not."""


class PeerLostDistError(PeerLostError, dist.DistBackendError):
    """A peer left while this rank waited for it."""


class RevokedDistError(RevokedError, dist.DistBackendError):
    """The group's team was revoked."""


class TimeoutDistError(TimeoutError, dist.DistBackendError):
    """A collective did not finish in time."""


class TransportDistError(TransportError, dist.DistBackendError):
    """A transport failed."""


#: pycoll's error types and their torch flavours, the most specific first.
_FLAVOURS = ((MismatchError, MismatchDistError), (PeerLostError, PeerLostDistError),
             (RevokedError, RevokedDistError), (TimeoutError, TimeoutDistError),
             (TransportError, TransportDistError))


def timed_out(exc: TimeoutError) -> str:
    """A timeout's text in the words torch's callers look for (gloo's: ``Timed out waiting 1000ms
    for ...``), followed by pycoll's (what it waited on)."""
    task = getattr(exc, "task", None)
    seconds = getattr(exc, "seconds", None)
    waited = f" {seconds * 1000:.0f}ms" if isinstance(seconds, (int, float)) else ""
    name = getattr(task, "name", None) or "the collective"
    return f"[pycoll] Timed out waiting{waited} for {name} to complete: {exc}"


def torch_error(exc: BaseException) -> BaseException:
    """``exc`` as torch's callers catch it: a ``DistBackendError`` that is also ``exc``'s pycoll
    type, with its text and attributes (``exc`` itself when it is not a pycoll error with a torch
    flavour, or already one)."""
    if not isinstance(exc, PycollError) or isinstance(exc, dist.DistBackendError):
        return exc
    for kind, flavour in _FLAVOURS:
        if isinstance(exc, kind):
            err = flavour.__new__(flavour)
            Exception.__init__(err, timed_out(exc) if kind is TimeoutError else str(exc))
            err.__dict__.update(exc.__dict__)
            return err.with_traceback(exc.__traceback__)
    return exc
