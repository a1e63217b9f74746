"""``pycoll.mpi.Comm``: an mpi4py look-alike whose collectives run on pycoll.

Switching an mpi4py program means changing the communicator object only::

    from mpi4py import MPI
    from pycoll.mpi import Comm
    comm = Comm(MPI.COMM_WORLD)
    comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)          # blocking, as mpi4py's
    comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.MAX).Wait()  # non-blocking

Buffer arguments are what mpi4py accepts: a buffer, ``[buf, MPI.FLOAT]``, ``[buf, count,
MPI.FLOAT]`` or ``[buf, (count, displ), MPI.FLOAT]``, and ``MPI.IN_PLACE`` as the send buffer.
Everything pycoll does not implement is passed through to the mpi4py communicator.
"""

from __future__ import annotations

import itertools
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import to_numpy_dtype

from pycoll.buffers import as_array, as_bytes
from pycoll.engine.context import Context
from pycoll.engine.request import Request as _PycollRequest
from pycoll.team import Persistent, Team


def as_buffer(spec: Any, *, writable: bool = False, what: str = "buffer") -> np.ndarray:
    """A typed 1-D numpy view of an mpi4py buffer specification."""
    if isinstance(spec, (list, tuple)):
        if not spec or len(spec) > 3:
            raise ValueError(f"{what}: expected [buf, datatype], [buf, count, datatype] or "
                             f"[buf, (count, displ), datatype], got {len(spec)} items")
        buf, datatype = spec[0], spec[-1] if len(spec) > 1 else None
        if datatype is not None and not isinstance(datatype, MPI.Datatype):
            if len(spec) == 2:  # [buf, count]
                datatype, count_spec = None, spec[1]
            else:
                raise TypeError(f"{what}: the last item must be an MPI.Datatype, got {datatype!r}")
        else:
            count_spec = spec[1] if len(spec) == 3 else None
        if datatype is None:
            arr = as_array(buf, writable=writable, what=what)
        else:
            arr = as_bytes(buf, writable=writable, what=what).view(to_numpy_dtype(datatype))
        if count_spec is not None:
            count, displ = (count_spec if isinstance(count_spec, (list, tuple)) else (count_spec, 0))
            if displ < 0 or count < 0 or displ + count > arr.size:
                raise ValueError(f"{what}: count {count} at displacement {displ} exceeds the "
                                 f"buffer of {arr.size} elements")
            arr = arr[displ:displ + count]
        return arr
    return as_array(spec, writable=writable, what=what)


class Request:
    """What the ``I`` methods return: mpi4py's ``Wait()``/``Test()`` over a pycoll request."""

    __slots__ = ("request",)

    def __init__(self, request: _PycollRequest) -> None:
        self.request = request

    def Wait(self, status: Any = None) -> bool:  # noqa: N802 - mpi4py's name
        self.request.wait()
        return True

    def Test(self, status: Any = None) -> bool:  # noqa: N802
        return self.request.test()

    def Cancel(self) -> None:  # noqa: N802
        self.request.cancel()

    wait = Wait
    test = Test


class Prequest:
    """What the ``_init`` methods return (mpi4py's ``Prequest``): ``Start()`` runs the persistent
    collective once more, ``Wait()``/``Test()`` the current run, ``Free()`` releases it."""

    __slots__ = ("persistent",)

    def __init__(self, persistent: Persistent) -> None:
        self.persistent = persistent

    def Start(self) -> None:  # noqa: N802
        self.persistent.start()

    def Wait(self, status: Any = None) -> bool:  # noqa: N802
        self.persistent.wait()
        return True

    def Test(self, status: Any = None) -> bool:  # noqa: N802
        return self.persistent.test()

    def Free(self) -> None:  # noqa: N802
        self.persistent.free()

    @staticmethod
    def Startall(requests: Sequence[Prequest]) -> None:  # noqa: N802
        for req in requests:
            req.Start()


VBuffer = Tuple[np.ndarray, List[int], List[int]]


def as_vbuffer(spec: Any, size: int, *, writable: bool = False, what: str = "buffer") -> VBuffer:
    """``(array, counts, displs)`` of an mpi4py vector buffer specification: ``buf``,
    ``[buf, counts]``, ``[buf, (counts, displs)]``, ``[buf, datatype]``, ``[buf, counts, datatype]``,
    ``[buf, (counts, displs), datatype]`` or ``[buf, counts, displs, datatype]``. Without counts the
    buffer is split into ``size`` equal blocks."""
    counts = displs = None
    if isinstance(spec, (list, tuple)):
        if not 1 <= len(spec) <= 4:
            raise ValueError(f"{what}: expected [buf, counts, displs, datatype] or a shorter form, got "
                             f"{len(spec)} items")
        items = list(spec)
        datatype = items.pop() if len(items) > 1 and isinstance(items[-1], MPI.Datatype) else None
        buf = items[0]
        if len(items) == 2:
            counts = items[1]
            pair = isinstance(counts, tuple) and len(counts) == 2
            if pair and not isinstance(counts[0], (int, np.integer)):  # (counts, displs)
                counts, displs = counts
        elif len(items) == 3:
            counts, displs = items[1], items[2]
        arr = (as_array(buf, writable=writable, what=what) if datatype is None
               else as_bytes(buf, writable=writable, what=what).view(to_numpy_dtype(datatype)))
    else:
        arr = as_array(spec, writable=writable, what=what)
    if counts is None:
        if arr.size % size:
            raise ValueError(f"{what}: {arr.size} elements do not split into {size} equal blocks; "
                             "give counts")
        counts = [arr.size // size] * size
    counts = [int(c) for c in counts]
    if displs is None:
        displs = list(itertools.accumulate([0] + counts[:-1]))
    return arr, counts, [int(d) for d in displs]


def _in_place(sendbuf: Any) -> bool:
    return sendbuf is MPI.IN_PLACE or sendbuf is None


class Comm:
    """An mpi4py communicator whose collectives go through pycoll (a :class:`pycoll.Team`).

    Every collective has mpi4py's three forms: blocking (``Allgather``), non-blocking
    (``Iallgather``, returns a :class:`Request`) and persistent (``Allgather_init``, returns a
    :class:`Prequest`). pycoll's keywords (``priority``, ``tag``, ``algorithm``, ``timeout``)
    may follow the MPI arguments. For ``Gatherv``/``Scatterv`` only the root knows the counts (as
    in MPI), so they run the ``linear`` algorithm unless ``algorithm=`` says otherwise.
    """

    def __init__(self, comm: Any = None, ctx: Optional[Context] = None) -> None:
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.team = Team.from_mpi(self.comm, ctx)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)

    @property
    def rank(self) -> int:
        return self.team.rank

    @property
    def size(self) -> int:
        return self.team.size

    def Get_rank(self) -> int:  # noqa: N802
        return self.team.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.team.size

    def _start(self, coll: str, args: tuple, kw: dict) -> Request:
        return Request(getattr(self.team, coll)(*args, **kw))

    def _init(self, coll: str, args: tuple, kw: dict) -> Prequest:
        return Prequest(getattr(self.team, coll + "_init")(*args, **kw))

    # ------------------------------------------------------------------ argument conversion
    # Each returns the arguments of the Team method of the same collective.
    def _allreduce(self, sendbuf: Any, recvbuf: Any, op: Any) -> tuple:
        dst = as_buffer(recvbuf, writable=True, what="recvbuf")
        return (dst, None, op) if _in_place(sendbuf) else (as_buffer(sendbuf, what="sendbuf"), dst, op)

    def _reduce(self, sendbuf: Any, recvbuf: Any, op: Any, root: int) -> tuple:
        mine = self.team.rank == root
        dst = as_buffer(recvbuf, writable=True, what="recvbuf") if mine and recvbuf is not None else None
        if _in_place(sendbuf):
            return dst, None, op, root
        return as_buffer(sendbuf, what="sendbuf"), dst, op, root

    def _allgather(self, sendbuf: Any, recvbuf: Any) -> tuple:
        dst = as_buffer(recvbuf, writable=True, what="recvbuf")
        return None if _in_place(sendbuf) else as_buffer(sendbuf, what="sendbuf"), dst

    def _allgatherv(self, sendbuf: Any, recvbuf: Any) -> tuple:
        dst, counts, displs = as_vbuffer(recvbuf, self.size, writable=True, what="recvbuf")
        return None if _in_place(sendbuf) else as_buffer(sendbuf, what="sendbuf"), dst, counts, displs

    def _reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any) -> tuple:
        return as_buffer(sendbuf, what="sendbuf"), as_buffer(recvbuf, writable=True, what="recvbuf"), op

    def _reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Optional[Sequence[int]],
                        op: Any) -> tuple:
        dst = as_buffer(recvbuf, writable=True, what="recvbuf")
        if recvcounts is None:  # as mpi4py: every rank's count is its recvbuf's size
            recvcounts = self.team.comm.allgather(dst.size)
        return as_buffer(sendbuf, what="sendbuf"), dst, list(recvcounts), op

    def _alltoall(self, sendbuf: Any, recvbuf: Any) -> tuple:
        return as_buffer(sendbuf, what="sendbuf"), as_buffer(recvbuf, writable=True, what="recvbuf")

    def _alltoallv(self, sendbuf: Any, recvbuf: Any) -> tuple:
        src, scounts, sdispls = as_vbuffer(sendbuf, self.size, what="sendbuf")
        dst, rcounts, rdispls = as_vbuffer(recvbuf, self.size, writable=True, what="recvbuf")
        return src, dst, scounts, rcounts, sdispls, rdispls

    def _gather(self, sendbuf: Any, recvbuf: Any, root: int) -> tuple:
        if self.team.rank != root:
            return as_buffer(sendbuf, what="sendbuf"), None, root
        dst = as_buffer(recvbuf, writable=True, what="recvbuf")
        return None if _in_place(sendbuf) else as_buffer(sendbuf, what="sendbuf"), dst, root

    def _gatherv(self, sendbuf: Any, recvbuf: Any, root: int) -> tuple:
        if self.team.rank != root:
            return as_buffer(sendbuf, what="sendbuf"), None, None, None, root
        dst, counts, displs = as_vbuffer(recvbuf, self.size, writable=True, what="recvbuf")
        return None if _in_place(sendbuf) else as_buffer(sendbuf, what="sendbuf"), dst, counts, displs, root

    def _scatter(self, sendbuf: Any, recvbuf: Any, root: int) -> tuple:
        if self.team.rank != root:
            return None, as_buffer(recvbuf, writable=True, what="recvbuf"), root
        dst = None if _in_place(recvbuf) else as_buffer(recvbuf, writable=True, what="recvbuf")
        return as_buffer(sendbuf, what="sendbuf"), dst, root

    def _scatterv(self, sendbuf: Any, recvbuf: Any, root: int) -> tuple:
        if self.team.rank != root:
            return None, as_buffer(recvbuf, writable=True, what="recvbuf"), None, None, root
        src, counts, displs = as_vbuffer(sendbuf, self.size, what="sendbuf")
        dst = None if _in_place(recvbuf) else as_buffer(recvbuf, writable=True, what="recvbuf")
        return src, dst, counts, displs, root

    @staticmethod
    def _linear(kw: dict) -> dict:
        """Gatherv/Scatterv: non-roots do not know the counts, so every rank runs ``linear``."""
        return kw if "algorithm" in kw else dict(kw, algorithm="linear")

    # ------------------------------------------------------------------ the collectives
    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, **kw: Any) -> None:  # noqa: N802
        self._start("allreduce", self._allreduce(sendbuf, recvbuf, op), kw).Wait()

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, **kw: Any) -> Request:  # noqa: N802
        return self._start("allreduce", self._allreduce(sendbuf, recvbuf, op), kw)

    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("allreduce", self._allreduce(sendbuf, recvbuf, op), kw)

    def Bcast(self, buf: Any, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self.Ibcast(buf, root, **kw).Wait()

    def Ibcast(self, buf: Any, root: int = 0, **kw: Any) -> Request:  # noqa: N802
        return self._start("bcast", (as_buffer(buf, writable=True, what="buf"), root), kw)

    def Bcast_init(self, buf: Any, root: int = 0, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("bcast", (as_buffer(buf, writable=True, what="buf"), root), kw)

    def Barrier(self, **kw: Any) -> None:  # noqa: N802
        self.Ibarrier(**kw).Wait()

    def Ibarrier(self, **kw: Any) -> Request:  # noqa: N802
        return self._start("barrier", (), kw)

    def Barrier_init(self, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("barrier", (), kw)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self._start("reduce", self._reduce(sendbuf, recvbuf, op, root), kw).Wait()

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0,  # noqa: N802
                **kw: Any) -> Request:
        return self._start("reduce", self._reduce(sendbuf, recvbuf, op, root), kw)

    def Reduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0,  # noqa: N802
                    **kw: Any) -> Prequest:
        return self._init("reduce", self._reduce(sendbuf, recvbuf, op, root), kw)

    def Allgather(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> None:  # noqa: N802
        self._start("allgather", self._allgather(sendbuf, recvbuf), kw).Wait()

    def Iallgather(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Request:  # noqa: N802
        return self._start("allgather", self._allgather(sendbuf, recvbuf), kw)

    def Allgather_init(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("allgather", self._allgather(sendbuf, recvbuf), kw)

    def Allgatherv(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> None:  # noqa: N802
        self._start("allgatherv", self._allgatherv(sendbuf, recvbuf), kw).Wait()

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Request:  # noqa: N802
        return self._start("allgatherv", self._allgatherv(sendbuf, recvbuf), kw)

    def Allgatherv_init(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("allgatherv", self._allgatherv(sendbuf, recvbuf), kw)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, **kw: Any) -> None:  # noqa: N802
        self._start("reduce_scatter", self._reduce_scatter_block(sendbuf, recvbuf, op), kw).Wait()

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,  # noqa: N802
                              **kw: Any) -> Request:
        return self._start("reduce_scatter", self._reduce_scatter_block(sendbuf, recvbuf, op), kw)

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,  # noqa: N802
                                  **kw: Any) -> Prequest:
        return self._init("reduce_scatter", self._reduce_scatter_block(sendbuf, recvbuf, op), kw)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Optional[Sequence[int]] = None,  # noqa: N802
                       op: Any = MPI.SUM, **kw: Any) -> None:
        self._start("reduce_scatterv", self._reduce_scatter(sendbuf, recvbuf, recvcounts, op), kw).Wait()

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Optional[Sequence[int]] = None,  # noqa: N802
                        op: Any = MPI.SUM, **kw: Any) -> Request:
        return self._start("reduce_scatterv", self._reduce_scatter(sendbuf, recvbuf, recvcounts, op), kw)

    def Reduce_scatter_init(self, sendbuf: Any, recvbuf: Any,  # noqa: N802
                            recvcounts: Optional[Sequence[int]] = None, op: Any = MPI.SUM,
                            **kw: Any) -> Prequest:
        return self._init("reduce_scatterv", self._reduce_scatter(sendbuf, recvbuf, recvcounts, op), kw)

    def Alltoall(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> None:  # noqa: N802
        self._start("alltoall", self._alltoall(sendbuf, recvbuf), kw).Wait()

    def Ialltoall(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Request:  # noqa: N802
        return self._start("alltoall", self._alltoall(sendbuf, recvbuf), kw)

    def Alltoall_init(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("alltoall", self._alltoall(sendbuf, recvbuf), kw)

    def Alltoallv(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> None:  # noqa: N802
        self._start("alltoallv", self._alltoallv(sendbuf, recvbuf), kw).Wait()

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Request:  # noqa: N802
        return self._start("alltoallv", self._alltoallv(sendbuf, recvbuf), kw)

    def Alltoallv_init(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("alltoallv", self._alltoallv(sendbuf, recvbuf), kw)

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self._start("gather", self._gather(sendbuf, recvbuf, root), kw).Wait()

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Request:  # noqa: N802
        return self._start("gather", self._gather(sendbuf, recvbuf, root), kw)

    def Gather_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("gather", self._gather(sendbuf, recvbuf, root), kw)

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self._start("gatherv", self._gatherv(sendbuf, recvbuf, root), self._linear(kw)).Wait()

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Request:  # noqa: N802
        return self._start("gatherv", self._gatherv(sendbuf, recvbuf, root), self._linear(kw))

    def Gatherv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("gatherv", self._gatherv(sendbuf, recvbuf, root), self._linear(kw))

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self._start("scatter", self._scatter(sendbuf, recvbuf, root), kw).Wait()

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Request:  # noqa: N802
        return self._start("scatter", self._scatter(sendbuf, recvbuf, root), kw)

    def Scatter_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("scatter", self._scatter(sendbuf, recvbuf, root), kw)

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self._start("scatterv", self._scatterv(sendbuf, recvbuf, root), self._linear(kw)).Wait()

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Request:  # noqa: N802
        return self._start("scatterv", self._scatterv(sendbuf, recvbuf, root), self._linear(kw))

    def Scatterv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Prequest:  # noqa: N802
        return self._init("scatterv", self._scatterv(sendbuf, recvbuf, root), self._linear(kw))

    def __repr__(self) -> str:
        return f"<pycoll.mpi.Comm rank {self.rank}/{self.size} over {self.comm!r}>"
