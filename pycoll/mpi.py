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

from typing import Any, Optional

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import to_numpy_dtype

from pycoll.buffers import as_array, as_bytes
from pycoll.engine.context import Context
from pycoll.engine.request import Request as _PycollRequest
from pycoll.team import Team


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


class Comm:
    """An mpi4py communicator whose collectives go through pycoll (a :class:`pycoll.Team`)."""

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

    # ------------------------------------------------------------------ allreduce
    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, **kw: Any) -> Request:  # noqa: N802
        """Non-blocking allreduce (``MPI_Iallreduce``); pycoll keywords (``priority``, ``tag``,
        ``algorithm``, ``timeout``) may follow."""
        dst = as_buffer(recvbuf, writable=True, what="recvbuf")
        if sendbuf is MPI.IN_PLACE or sendbuf is None:
            return Request(self.team.allreduce(dst, None, op, **kw))
        src = as_buffer(sendbuf, what="sendbuf")
        return Request(self.team.allreduce(src, dst, op, **kw))

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, **kw: Any) -> None:  # noqa: N802
        """Blocking allreduce (``MPI_Allreduce``)."""
        self.Iallreduce(sendbuf, recvbuf, op, **kw).Wait()

    # ------------------------------------------------------------------ the other collectives
    def Ibcast(self, buf: Any, root: int = 0, **kw: Any) -> Request:  # noqa: N802
        return Request(self.team.bcast(as_buffer(buf, writable=True, what="buf"), root, **kw))

    def Bcast(self, buf: Any, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self.Ibcast(buf, root, **kw).Wait()

    def Ibarrier(self, **kw: Any) -> Request:  # noqa: N802
        return Request(self.team.barrier(**kw))

    def Barrier(self, **kw: Any) -> None:  # noqa: N802
        self.Ibarrier(**kw).Wait()

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0,  # noqa: N802
                **kw: Any) -> Request:
        mine = self.team.rank == root
        dst = as_buffer(recvbuf, writable=True, what="recvbuf") if mine and recvbuf is not None else None
        if sendbuf is MPI.IN_PLACE or sendbuf is None:
            return Request(self.team.reduce(dst, None, op, root, **kw))
        return Request(self.team.reduce(as_buffer(sendbuf, what="sendbuf"), dst, op, root, **kw))

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self.Ireduce(sendbuf, recvbuf, op, root, **kw).Wait()

    def Iallgather(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Request:  # noqa: N802
        dst = as_buffer(recvbuf, writable=True, what="recvbuf")
        src = None if sendbuf is MPI.IN_PLACE else as_buffer(sendbuf, what="sendbuf")
        return Request(self.team.allgather(src, dst, **kw))

    def Allgather(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> None:  # noqa: N802
        self.Iallgather(sendbuf, recvbuf, **kw).Wait()

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,  # noqa: N802
                              **kw: Any) -> Request:
        return Request(self.team.reduce_scatter(as_buffer(sendbuf, what="sendbuf"),
                                                as_buffer(recvbuf, writable=True, what="recvbuf"), op, **kw))

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, **kw: Any) -> None:  # noqa: N802
        self.Ireduce_scatter_block(sendbuf, recvbuf, op, **kw).Wait()

    def Ialltoall(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> Request:  # noqa: N802
        return Request(self.team.alltoall(as_buffer(sendbuf, what="sendbuf"),
                                          as_buffer(recvbuf, writable=True, what="recvbuf"), **kw))

    def Alltoall(self, sendbuf: Any, recvbuf: Any, **kw: Any) -> None:  # noqa: N802
        self.Ialltoall(sendbuf, recvbuf, **kw).Wait()

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Request:  # noqa: N802
        dst = as_buffer(recvbuf, writable=True, what="recvbuf") if self.team.rank == root else None
        return Request(self.team.gather(as_buffer(sendbuf, what="sendbuf"), dst, root, **kw))

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self.Igather(sendbuf, recvbuf, root, **kw).Wait()

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> Request:  # noqa: N802
        src = as_buffer(sendbuf, what="sendbuf") if self.team.rank == root else None
        return Request(self.team.scatter(src, as_buffer(recvbuf, writable=True, what="recvbuf"), root, **kw))

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, **kw: Any) -> None:  # noqa: N802
        self.Iscatter(sendbuf, recvbuf, root, **kw).Wait()

    def __repr__(self) -> str:
        return f"<pycoll.mpi.Comm rank {self.rank}/{self.size} over {self.comm!r}>"
