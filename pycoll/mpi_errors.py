"""pycoll's errors as mpi4py's callers catch them (:class:`pycoll.mpi.Comm`): ``MPI.Exception``
subclasses that are pycoll's errors too, with pycoll's text and attributes, and the error class MPI
gives that failure (a mismatch ``MPI.ERR_TRUNCATE``, a lost peer ``MPI.ERR_PROC_FAILED``)."""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from pycoll.errors import (
    ClosedError,
    MismatchError,
    PeerLostError,
    PycollError,
    RevokedError,
    TimeoutError,
    TransportError,
)


class _MPIFlavour(MPI.Exception):
    """An ``MPI.Exception`` of error class :attr:`error_class_code` whose text is pycoll's."""

    error_class_code = MPI.ERR_OTHER

    def __init__(self, message: str, *args: Any, **kw: Any) -> None:
        MPI.Exception.__init__(self, self.error_class_code)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


# (the MPI flavour first: its __init__ and __str__ win over the pycoll error's)
class MismatchMPIError(_MPIFlavour, MismatchError):
    """Ranks called a collective with arguments that must agree and do not (MPI.ERR_TRUNCATE)."""

    error_class_code = MPI.ERR_TRUNCATE


class PeerLostMPIError(_MPIFlavour, PeerLostError):
    """A peer left while this rank waited for it (MPI.ERR_PROC_FAILED, as ULFM's)."""

    error_class_code = MPI.ERR_PROC_FAILED


class RevokedMPIError(_MPIFlavour, RevokedError):
    """The communicator's team was revoked (MPI.ERR_REVOKED where MPI has it, as ULFM's)."""

    error_class_code = getattr(MPI, "ERR_REVOKED", MPI.ERR_OTHER)


class ClosedMPIError(_MPIFlavour, ClosedError):
    """A call on a communicator after its ``Free()`` (MPI.ERR_COMM, as mpi4py's on a freed one)."""

    error_class_code = MPI.ERR_COMM


class TimeoutMPIError(_MPIFlavour, TimeoutError):
    """A collective did not finish in time (MPI.ERR_OTHER)."""


class TransportMPIError(_MPIFlavour, TransportError):
    """A transport failed (MPI.ERR_OTHER)."""


#: pycoll's error types and their MPI flavours, the most specific first.
_FLAVOURS = ((MismatchError, MismatchMPIError), (PeerLostError, PeerLostMPIError),
             (RevokedError, RevokedMPIError), (ClosedError, ClosedMPIError), (TimeoutError, TimeoutMPIError),
             (TransportError, TransportMPIError))


def mpi_error(exc: PycollError) -> BaseException:
    """``exc`` as mpi4py's callers catch it: an ``MPI.Exception`` that is also ``exc``'s pycoll
    type, with its text and attributes (``exc`` itself when it has no MPI flavour)."""
    for kind, flavour in _FLAVOURS:
        if isinstance(exc, kind):
            err = flavour(str(exc))
            err.__dict__.update(exc.__dict__)
            return err.with_traceback(exc.__traceback__)
    return exc
