"""The request objects of :class:`pycoll.mpi.Comm`, as mpi4py's: :class:`Request` (the ``I``
methods), :class:`Prequest` (the ``_init`` methods), :class:`Handed` (a call handed to MPI), and
:func:`waitall`/:func:`testall` over pycoll's and mpi4py's requests in any mix."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from pycoll.engine.context import Backoff
from pycoll.engine.request import Request as _PycollRequest
from pycoll.errors import PycollError
from pycoll.mpi_errors import mpi_error
from pycoll.mpispec import keep_failed
from pycoll.persistent import Persistent
from pycoll.tasks.task import COMPLETED


def waitall(requests: Sequence[Any], statuses: Any = None) -> bool:
    """Wait for every request of ``requests``: pycoll's (:class:`Request`, :class:`Prequest`) and
    mpi4py's alike, in any mix. Each is tested in turn until all are done, so neither engine
    waits while the other has work a peer needs (MPI progresses only inside MPI calls); between
    rounds the rank yields its core. (``statuses``: mpi4py's parameter, not filled in.)"""
    pending = [r for r in requests if not r.Test()]
    backoff = Backoff()  # (spin, yield the core, then nap: as a waiting rank of the engine)
    while pending:
        left = [r for r in pending if not r.Test()]
        if len(left) < len(pending):
            backoff.reset()
        else:
            backoff.idle()
        pending = left
    return True


def testall(requests: Sequence[Any], statuses: Any = None) -> bool:
    """Whether every request of ``requests`` (pycoll's and mpi4py's alike) is done; tests each."""
    done = True
    for r in requests:
        done = r.Test() and done  # (each is tested: a test is what progresses it)
    return done


class Request:
    """What the ``I`` methods return: mpi4py's ``Wait()``/``Test()`` over a pycoll request. It holds
    what keeps the call's buffers in place (``held``: exports of their memory, see
    :func:`pycoll.mpispec.hold`) until the call is done."""

    __slots__ = ("request", "held")

    def __init__(self, request: _PycollRequest, held: Optional[list] = None) -> None:
        self.request = request
        self.held = held

    def Wait(self, status: Any = None) -> bool:  # noqa: N802 - mpi4py's name
        try:
            self.request.wait()
        except PycollError as exc:
            keep_failed(self.held)  # (its collective may still be in flight)
            raise mpi_error(exc) from None
        finally:
            self.held = None
        return True

    def Test(self, status: Any = None) -> bool:  # noqa: N802
        try:
            done = self.request.test()
        except PycollError as exc:
            keep_failed(self.held)
            self.held = None
            raise mpi_error(exc) from None
        if done:
            self.held = None
        return done

    def Cancel(self) -> None:  # noqa: N802
        self.request.cancel()

    wait = Wait
    test = Test
    #: mpi4py's ``Request.Waitall`` and ``Testall`` over pycoll's and mpi4py's requests (mpi4py's
    #: own take only its own): see :func:`waitall`.
    Waitall = staticmethod(waitall)
    Testall = staticmethod(testall)


class Handed:
    """A call handed to MPI (:func:`unreduced`): ``wait``/``test``/``cancel`` of its MPI request,
    or nothing to wait for (a blocking call has already run)."""

    __slots__ = ("request",)

    def __init__(self, request: Any) -> None:
        self.request = request

    def wait(self) -> None:
        if self.request is not None:
            self.request.Wait()

    def test(self) -> bool:
        return self.request is None or self.request.Test()

    def cancel(self) -> None:
        if self.request is not None:
            self.request.Cancel()


class Prequest:
    """What the ``_init`` methods return (mpi4py's ``Prequest``): ``Start()`` runs the persistent
    collective once more, ``Wait()``/``Test()`` the current run, ``Free()`` releases it."""

    __slots__ = ("persistent", "copies", "held")

    def __init__(self, persistent: Persistent, copies: Sequence[Tuple[np.ndarray, np.ndarray]] = (),
                 held: Optional[list] = None) -> None:
        self.persistent = persistent
        #: (copy, of): an ``MPI.IN_PLACE`` input sent from a copy, made again at each start
        self.copies = copies
        #: What keeps its buffers in place until ``Free()`` (see :func:`pycoll.mpispec.hold`)
        self.held = held

    def Start(self) -> None:  # noqa: N802
        for copy, of in self.copies:
            np.copyto(copy, of)
        try:
            self.persistent.start()
        except PycollError as exc:
            raise mpi_error(exc) from None

    def Wait(self, status: Any = None) -> bool:  # noqa: N802
        try:
            self.persistent.wait()
        except PycollError as exc:
            raise mpi_error(exc) from None
        return True

    def Test(self, status: Any = None) -> bool:  # noqa: N802
        try:
            return self.persistent.test()
        except PycollError as exc:
            raise mpi_error(exc) from None

    def Free(self) -> None:  # noqa: N802
        last = self.persistent.request
        if last is not None and (not last.done or last.state is not COMPLETED):
            keep_failed(self.held)  # (its last run failed, or is still in flight)
        self.persistent.free()
        self.held = None

    @staticmethod
    def Startall(requests: Sequence[Any]) -> None:  # noqa: N802
        """Start every persistent request of ``requests`` (pycoll's and mpi4py's alike)."""
        for req in requests:
            req.Start()

    Waitall = staticmethod(waitall)
    Testall = staticmethod(testall)
