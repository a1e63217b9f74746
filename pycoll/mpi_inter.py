"""``pycoll.mpi.Comm`` over an intercommunicator: its collectives go to mpi4py unchanged.

pycoll runs collectives within one group of ranks (a team); an intercommunicator joins two groups,
and its collectives (a root named ``MPI.ROOT`` in one group and ``MPI.PROC_NULL`` beside it, data
that crosses from one group to the other) are MPI's to run. ``Comm(intercomm)`` therefore gives an
:class:`InterComm`, which hands every call to the mpi4py communicator as it is, so that code
written for mpi4py runs with ``Comm`` swapped in. What it makes comes back wrapped: an
intracommunicator (``Merge``) as a :class:`pycoll.mpi.Comm` whose collectives pycoll runs, an
intercommunicator (``Dup``, ``Split``, ``Create``) as another :class:`InterComm`.
"""

from __future__ import annotations

from typing import Any, Callable

from mpi4py import MPI


class InterComm:
    """An mpi4py intercommunicator behind ``pycoll.mpi.Comm``'s name: every attribute is the
    communicator's (``comm``); communicators it makes are wrapped (intracommunicators by
    ``wrap``, the Comm constructor)."""

    def __init__(self, comm: Any, wrap: Callable[[Any], Any]) -> None:
        if not isinstance(comm, MPI.Intercomm):
            raise TypeError(f"InterComm needs an mpi4py intercommunicator, got {comm!r}")
        self.comm = comm
        self._wrap = wrap

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def derived(self, comm: Any) -> Any:
        """``comm`` (made from this one) wrapped: ``MPI.COMM_NULL`` as it is."""
        if comm == MPI.COMM_NULL:
            return comm
        if isinstance(comm, MPI.Intercomm):
            return InterComm(comm, self._wrap)
        return self._wrap(comm)

    def Merge(self, high: bool = False) -> Any:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Merge``: the intracommunicator of both groups, as a :class:`pycoll.mpi.Comm`."""
        return self.derived(self.comm.Merge(high))

    def Dup(self, info: Any = None) -> Any:  # noqa: N802 - mpi4py's name
        return self.derived(self.comm.Dup() if info is None else self.comm.Dup(info))

    def Clone(self) -> Any:  # noqa: N802 - mpi4py's name
        return self.derived(self.comm.Clone())

    def Split(self, color: int = 0, key: int = 0) -> Any:  # noqa: N802 - mpi4py's name
        return self.derived(self.comm.Split(color, key))

    def Create(self, group: Any) -> Any:  # noqa: N802 - mpi4py's name
        return self.derived(self.comm.Create(group))

    def __eq__(self, other: Any) -> bool:
        return self.comm == getattr(other, "comm", other)

    def __ne__(self, other: Any) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]  # (as mpi4py's communicators)

    def __repr__(self) -> str:
        return f"<pycoll.mpi.Comm over intercommunicator {self.comm!r}: collectives by MPI>"


__all__ = ["InterComm"]
