"""Teams: a group of ranks that run collectives together (UCC's team, MPI's communicator).

A team knows its rank and size, the progress engine (:class:`~pycoll.engine.Context`) that runs
its schedules, and the transport that moves its messages. Algorithms reach peers only through the
team's point-to-point methods, never a transport directly.

Messages are keyed by tags the team builds: user point-to-point messages by ``("p", tag)``,
collectives by ``("c", sequence number or user tag, step)``, so concurrent collectives on one team
never match each other's messages.
"""

from __future__ import annotations

import itertools
import math
import socket
from typing import Any, Dict, Hashable, List, Optional

import numpy as np

from pycoll import algorithms
from pycoll.algorithms.base import CollArgs
from pycoll.buffers import as_array, as_bytes
from pycoll.engine.context import Context, get_context
from pycoll.engine.request import Request
from pycoll.ops import ReduceOp, as_op, check_op
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import COMPLETED, Task
from pycoll.tl.base import Transport, TransportRequest
from pycoll.tl.local import LocalFabric

_EMPTY = np.empty(0, np.uint8)

#: Finished collectives kept per call shape for reuse, and shapes remembered per team.
MAX_PLANS_PER_SHAPE = 4
MAX_PLAN_SHAPES = 64


class Team:
    """``size`` ranks running collectives together; this object is rank ``rank``'s end."""

    def __init__(self, rank: int, size: int, transport: Transport, ctx: Optional[Context] = None, *,
                 name: str = "team") -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a team of {size}")
        self.rank = rank
        self.size = size
        self.transport = transport
        self.ctx = ctx if ctx is not None else get_context()
        self.name = name
        self._seq = itertools.count()
        self._tag_uses: Dict[Hashable, int] = {}
        self._plans: Dict[tuple, List[Task]] = {}
        self._selected: Dict[int, str] = {}  # allreduce bytes -> default algorithm
        self._recycle_done = self._recycle  # one bound method for every request
        #: The node-shared segment when all ranks share a host and shm is enabled (else None).
        self.shared: Any = None

    # ------------------------------------------------------------------ point to point
    def isend(self, buf: Any, peer: int, tag: Hashable = 0) -> TransportRequest:
        """Non-blocking send of ``buf`` to team rank ``peer``; ``req.test()`` says when done."""
        return self.transport.isend(as_bytes(buf), self._peer(peer), ("p", tag))

    def irecv(self, buf: Any, peer: int, tag: Hashable = 0) -> TransportRequest:
        """Non-blocking receive into ``buf`` from team rank ``peer``."""
        return self.transport.irecv(as_bytes(buf, writable=True), self._peer(peer), ("p", tag))

    def _peer(self, peer: int) -> int:
        if not 0 <= peer < self.size:
            raise ValueError(f"{self.name}: peer {peer} is not a rank of a team of {self.size}")
        return peer

    def next_sequence(self) -> int:
        """The sequence number of the next untagged collective (matched across ranks by order)."""
        return next(self._seq)

    def _coll_key(self, tag: Optional[Hashable]) -> tuple:
        """The message key of a new collective: ``("c", seq)`` for untagged collectives (matched
        by posting order), ``("u", tag, k)`` for the k-th use of a user tag (matched by tag)."""
        if tag is None:
            return ("c", next(self._seq))
        uses = self._tag_uses.get(tag, 0)
        self._tag_uses[tag] = uses + 1
        return ("u", tag, uses)

    # ------------------------------------------------------------------ collectives
    def allreduce(self, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM, *, priority: int = 0,
                  tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                  timeout: Optional[float] = None, **options: Any) -> Request:
        """Start an allreduce of ``sendbuf`` into ``recvbuf`` (``None``: in place); returns a
        :class:`~pycoll.Request` whose ``wait()`` returns the output buffer.

        ``algorithm`` forces one (``rd``, ``ring``, ``knomial``; options such as ``radix=`` go to
        it); ``tag`` matches the collective across ranks by tag instead of posting order;
        ``priority`` orders it in the engine (lower first); ``timeout`` (seconds) overrides
        ``PYCOLL_TIMEOUT``.
        """
        if type(op) is not ReduceOp:
            op = as_op(op)
        src, dst, out = self._allreduce_buffers(sendbuf, recvbuf)
        check_op(op, src.dtype)
        return self._post("allreduce", src, dst, op, 0, out, priority, tag, algorithm, timeout, options)

    @staticmethod
    def _allreduce_buffers(sendbuf: Any, recvbuf: Any) -> tuple:
        """(src, dst, what wait() returns) of an elementwise collective; ``recvbuf=None``: in place."""
        if recvbuf is None:
            src = dst = as_array(sendbuf, writable=True, what="sendbuf (in place)")
            return src, dst, sendbuf
        src = as_array(sendbuf, what="sendbuf")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        if src.dtype != dst.dtype or src.size != dst.size:
            raise ValueError(f"allreduce: sendbuf is {src.size} x {src.dtype}, recvbuf {dst.size} x "
                             f"{dst.dtype}; they must match")
        return src, dst, recvbuf

    def bcast(self, buf: Any, root: int = 0, *, priority: int = 0, tag: Optional[Hashable] = None,
              algorithm: Optional[str] = None, timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a broadcast of ``buf`` from team rank ``root`` into ``buf`` on every rank."""
        arr = as_bytes(buf, writable=True, what="buf")  # a broadcast moves bytes, whatever the type
        self._check_root(root, "bcast")
        return self._post("bcast", arr, arr, ReduceOp.SUM, root, buf, priority, tag, algorithm, timeout,
                          options)

    def barrier(self, *, priority: int = 0, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a barrier: its request completes once every rank of the team has entered it."""
        return self._post("barrier", _EMPTY, _EMPTY, ReduceOp.SUM, 0, None, priority, tag, algorithm,
                          timeout, options)

    def reduce(self, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM, root: int = 0, *,
               priority: int = 0, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
               timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a reduction of every rank's ``sendbuf`` into ``recvbuf`` on ``root`` (``None`` at
        the root: in place; ignored elsewhere)."""
        op = as_op(op)
        self._check_root(root, "reduce")
        if self.rank == root:
            src, dst, out = self._allreduce_buffers(sendbuf, recvbuf)
        else:
            src = dst = as_array(sendbuf, what="sendbuf")
            out = None
        check_op(op, src.dtype)
        return self._post("reduce", src, dst, op, root, out, priority, tag, algorithm, timeout, options)

    def allgather(self, sendbuf: Any, recvbuf: Any, *, priority: int = 0, tag: Optional[Hashable] = None,
                  algorithm: Optional[str] = None, timeout: Optional[float] = None,
                  **options: Any) -> Request:
        """Start an allgather: ``recvbuf`` gets every rank's ``sendbuf`` in rank order
        (``sendbuf=None``: in place, this rank's block of ``recvbuf`` is its contribution)."""
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        src = self._own_block(sendbuf, dst, "allgather")
        return self._post("allgather", src, dst, ReduceOp.SUM, 0, recvbuf, priority, tag, algorithm, timeout,
                          options)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: Any = ReduceOp.SUM, *, priority: int = 0,
                       tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                       timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a reduce-scatter (block): rank r gets the reduction of block r of every rank's
        ``sendbuf`` (``team.size`` blocks of ``recvbuf``'s size)."""
        op = as_op(op)
        src = as_array(sendbuf, what="sendbuf")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        self._check_blocks(src, dst, "reduce_scatter", "sendbuf", "recvbuf")
        check_op(op, src.dtype)
        return self._post("reduce_scatter", src, dst, op, 0, recvbuf, priority, tag, algorithm, timeout,
                          options)

    def alltoall(self, sendbuf: Any, recvbuf: Any, *, priority: int = 0, tag: Optional[Hashable] = None,
                 algorithm: Optional[str] = None, timeout: Optional[float] = None,
                 **options: Any) -> Request:
        """Start an alltoall: block j of ``sendbuf`` goes to rank j, which puts it in block r (this
        rank) of its ``recvbuf``."""
        src = as_array(sendbuf, what="sendbuf")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        if src.dtype != dst.dtype or src.size != dst.size or src.size % self.size:
            raise ValueError(f"alltoall: sendbuf ({src.size} x {src.dtype}) and recvbuf ({dst.size} x "
                             f"{dst.dtype}) must be equal and hold {self.size} blocks")
        return self._post("alltoall", src, dst, ReduceOp.SUM, 0, recvbuf, priority, tag, algorithm, timeout,
                          options)

    def gather(self, sendbuf: Any, recvbuf: Any = None, root: int = 0, *, priority: int = 0,
               tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
               timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a gather of every rank's ``sendbuf`` into ``recvbuf`` on ``root`` (rank order;
        ``recvbuf`` is ignored on other ranks)."""
        self._check_root(root, "gather")
        src = as_array(sendbuf, what="sendbuf")
        dst = src
        if self.rank == root:
            dst = as_array(recvbuf, writable=True, what="recvbuf")
            self._check_blocks(dst, src, "gather", "recvbuf", "sendbuf")
        return self._post("gather", src, dst, ReduceOp.SUM, root, recvbuf, priority, tag, algorithm, timeout,
                          options)

    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, priority: int = 0,
                tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a scatter: block r of ``sendbuf`` on ``root`` goes to ``recvbuf`` of rank r
        (``sendbuf`` is ignored on other ranks)."""
        self._check_root(root, "scatter")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        src = dst
        if self.rank == root:
            src = as_array(sendbuf, what="sendbuf")
            self._check_blocks(src, dst, "scatter", "sendbuf", "recvbuf")
        return self._post("scatter", src, dst, ReduceOp.SUM, root, recvbuf, priority, tag, algorithm, timeout,
                          options)

    def _check_blocks(self, whole: np.ndarray, block: np.ndarray, coll: str, whole_name: str,
                      block_name: str) -> None:
        if whole.dtype != block.dtype or whole.size != self.size * block.size:
            raise ValueError(f"{coll}: {whole_name} ({whole.size} x {whole.dtype}) must hold {self.size} "
                             f"blocks of {block_name} ({block.size} x {block.dtype})")

    def _own_block(self, sendbuf: Any, dst: np.ndarray, coll: str) -> np.ndarray:
        """The contribution of this rank: ``sendbuf``, or (``None``) its block of ``dst``."""
        if sendbuf is None:
            if dst.size % self.size:
                raise ValueError(f"{coll}: recvbuf of {dst.size} elements is not {self.size} blocks")
            m = dst.size // self.size
            return dst[self.rank * m:(self.rank + 1) * m]
        src = as_array(sendbuf, what="sendbuf")
        self._check_blocks(dst, src, coll, "recvbuf", "sendbuf")
        return src

    def _check_root(self, root: int, coll: str) -> None:
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise ValueError(f"{coll}: root {root!r} is not a rank of a team of {self.size}")

    def _post(self, coll: str, src: np.ndarray, dst: np.ndarray, op: ReduceOp, root: int, out: Any,
              priority: int, tag: Optional[Hashable], algorithm: Optional[str], timeout: Optional[float],
              options: dict) -> Request:
        """Build (or reuse) the collective's task and submit it. Everything the caller passed has
        been checked: nothing here fails before the message key is taken."""
        task, key, shape = self._make(coll, src, dst, op, root, tag, algorithm, options, reuse=True)
        if shape is None:  # partitioned: a schedule of parts, each its own unit of credit
            return self._submit(task, priority, timeout, out)
        return self._submit(self._unit(task, key), priority, timeout, out, shape)

    def _make(self, coll: str, src: np.ndarray, dst: np.ndarray, op: ReduceOp, root: int,
              tag: Optional[Hashable], algorithm: Optional[str], options: dict, reuse: bool) -> tuple:
        """``(task, key, shape)`` of a new collective: a finished task of the same shape rebound
        to these buffers and a new key (``reuse``), or a new one; ``shape`` is None for a
        partitioned collective (which is never reused)."""
        if algorithm is None:
            name = self._selected.get((coll, dst.nbytes, tag is None)) or self._select(coll, dst.nbytes, tag)
        else:
            name = algorithm
        shape = (coll, name, dst.size, dst.dtype, id(op), src is dst, root,
                 tuple(sorted(options.items())) if options else ())
        pool = self._plans.get(shape) if reuse else None
        if pool:  # a finished collective of this shape: reuse its schedule and scratch
            key = ("c", next(self._seq)) if tag is None else self._coll_key(tag)
            task = pool.pop()
            task.rebind(src, dst, key)
            return task, key, shape
        build = algorithms.get(coll, name)  # raises for an unknown name before a key is used
        if name == "shm" and (self.shared is None or tag is not None):
            raise ValueError(f"{coll}: algorithm 'shm' needs an untagged call on a team whose ranks "
                             "share a host (and PYCOLL_TLS allowing shm)")
        key = self._coll_key(tag)
        pb = self.ctx.partition_bytes
        if coll == "allreduce" and pb and dst.nbytes > pb and self.size > 1:
            return self._partitioned(build, coll, key, src, dst, op, pb, options), key, None
        return build(self._args(coll, key, src, dst, op, name, options, root)), key, shape

    # ------------------------------------------------------------------ persistent collectives
    def allreduce_init(self, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM, *, priority: int = 0,
                       tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                       timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent allreduce (MPI-4's ``MPI_Allreduce_init``): built once, run by each
        ``start()``; the buffers may be refilled between starts."""
        if type(op) is not ReduceOp:
            op = as_op(op)
        src, dst, out = self._allreduce_buffers(sendbuf, recvbuf)
        check_op(op, src.dtype)
        return Persistent(self, "allreduce", src, dst, op, 0, out, priority, tag, algorithm, timeout, options)

    def bcast_init(self, buf: Any, root: int = 0, *, priority: int = 0, tag: Optional[Hashable] = None,
                   algorithm: Optional[str] = None, timeout: Optional[float] = None,
                   **options: Any) -> Persistent:
        """A persistent broadcast."""
        arr = as_bytes(buf, writable=True, what="buf")  # a broadcast moves bytes, whatever the type
        self._check_root(root, "bcast")
        return Persistent(self, "bcast", arr, arr, ReduceOp.SUM, root, buf, priority, tag, algorithm, timeout,
                          options)

    def barrier_init(self, *, priority: int = 0, tag: Optional[Hashable] = None,
                     algorithm: Optional[str] = None, timeout: Optional[float] = None,
                     **options: Any) -> Persistent:
        """A persistent barrier."""
        return Persistent(self, "barrier", _EMPTY, _EMPTY, ReduceOp.SUM, 0, None, priority, tag, algorithm,
                          timeout, options)

    def _select(self, coll: str, nbytes: int, tag: Optional[Hashable]) -> str:
        name = algorithms.select(coll, self.size, nbytes, shared=self.shared is not None and tag is None)
        if len(self._selected) > 4096:
            self._selected.clear()
        self._selected[(coll, nbytes, tag is None)] = name
        return name

    def _recycle(self, req: Request) -> None:
        """A collective finished and its request was collected: keep its task for reuse (the
        next call of the same shape rebinds it to its buffers and key)."""
        task = req.task
        shape = task._shape
        if task.state is not COMPLETED or not hasattr(task, "rebind"):
            task.finalize()
            return
        pool = self._plans.get(shape)
        if pool is None:
            if len(self._plans) >= MAX_PLAN_SHAPES:  # forget the oldest shape
                for old in self._plans.pop(next(iter(self._plans))):
                    old.finalize()
            pool = self._plans[shape] = []
        if len(pool) < MAX_PLANS_PER_SHAPE:
            pool.append(task)
        else:
            task.finalize()

    def _unit(self, task: Task, key: tuple) -> Task:
        """Make ``task`` (one collective, or one part of it) a unit of credit: it holds its bytes
        while in progress, and starts whatever the credit once a peer has started it.

        Only a rank whose first move is a send takes credit: one that starts by waiting for a
        peer (a bcast or scatter receiver, a reduce or gather root) injects nothing until that
        peer's data arrives, and must not hold credit meanwhile, or two ranks could each hold the
        credit the other needs. A rank that sends first makes its peers start (their transports
        report the message), so the collective always finishes."""
        task.credit = task.nbytes if getattr(task, "sends_first", True) else 0
        if task.credit and self.ctx.credit_bytes:
            self.ctx.watch_demand(task, self.transport, key)
        return task

    def _args(self, coll: str, key: tuple, src: np.ndarray, dst: np.ndarray, op: ReduceOp, name: str,
              options: dict, root: int = 0) -> CollArgs:
        return CollArgs(coll, self.rank, self.size, self.transport.channel(key), src, dst, op, root,
                        name=f"{coll}:{name}@{self.rank}", options=options, shared=self.shared)

    def _partitioned(self, build: Any, coll: str, key: tuple, src: np.ndarray, dst: np.ndarray,
                     op: ReduceOp, part_bytes: int, options: dict) -> Task:
        """An elementwise collective as independent parts of at most ``part_bytes`` (same key plus
        the part index): large work split so that urgent collectives can go in between."""
        per = max(1, part_bytes // dst.itemsize)
        sched = Schedule(name=f"{coll}#{key[1]}/parts@{self.rank}")
        for i, lo in enumerate(range(0, dst.size, per)):
            sl = slice(lo, lo + per)
            part_key = (*key, "part", i)
            sched.add(self._unit(build(self._args(coll, part_key, src[sl], dst[sl], op, coll, options)),
                                 part_key))
        return sched

    def _submit(self, task: Task, priority: int, timeout: Optional[float], out: Any,
                 shape: Optional[tuple] = None) -> Request:
        t = self.ctx.timeout if timeout is None else timeout
        task.timeout = None if (t is None or t == math.inf or t <= 0) else t
        task.priority = priority
        if shape is None:
            return self.ctx.submit(task, result=out)
        task._shape = shape
        return self.ctx.submit(task, result=out, on_done=self._recycle_done)

    def __repr__(self) -> str:
        return f"<Team {self.name} rank {self.rank}/{self.size} over {self.transport.name}>"

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mpi(cls, comm: Any, ctx: Optional[Context] = None) -> Team:
        """A team over an mpi4py intracommunicator (``COMM_WORLD`` or any sub-communicator).

        The communicator is duplicated, so pycoll's messages never meet the caller's. Collective
        over ``comm``: every rank calls it.
        """
        from mpi4py import MPI

        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"Team.from_mpi needs an mpi4py intracommunicator, got {comm!r}")
        dup = comm.Dup()
        ctx = ctx if ctx is not None else get_context()
        if dup.Get_size() == 1:
            from pycoll.tl.self import SelfTransport

            transport: Transport = SelfTransport()
        else:
            from pycoll.tl.mpi import MPITransport

            transport = MPITransport(dup)
            ctx.add_transport(transport)
        name = comm.Get_name() or "mpi"
        team = cls(dup.Get_rank(), dup.Get_size(), transport, ctx, name=name)
        team.comm = dup
        team._attach_shm(lambda value: dup.allgather(value))
        return team

    @classmethod
    def from_store(cls, store: Any, rank: int, size: int, ctx: Optional[Context] = None, *,
                   prefix: str = "pycoll", advertise: Optional[str] = None) -> Team:
        """A team bootstrapped through a key-value store (pycoll's :class:`~pycoll.store.TCPStore`
        or a torch c10d ``Store``): ranks exchange addresses in the store and connect with TCP.

        Collective: all ``size`` ranks call it, in the same order if they make several teams.
        ``advertise`` is the address peers use to reach this rank (default: the address this
        host uses to reach the store, or 127.0.0.1).
        """
        from pycoll.store import allgather
        from pycoll.tl.base import key_hash

        if not 0 <= rank < size:
            raise ValueError(f"from_store: rank {rank} is not in a team of {size}")
        global _store_teams
        _store_teams += 1
        team_prefix = f"{prefix}/team{_store_teams}"
        ctx = ctx if ctx is not None else get_context()
        if size == 1:
            from pycoll.tl.self import SelfTransport

            transport: Transport = SelfTransport()
        else:
            from pycoll.tl.tcp import TCPTransport, connect_mesh

            if advertise is None:
                advertise = _local_address(store)

            def exchange(value: bytes) -> List[bytes]:
                return allgather(store, f"{team_prefix}/addr", rank, size, value)

            socks = connect_mesh(rank, size, exchange, key_hash(team_prefix), advertise=advertise)
            transport = TCPTransport(rank, size, socks)
            ctx.add_transport(transport)
        team = cls(rank, size, transport, ctx, name=team_prefix)
        team.store = store
        rounds = itertools.count()
        team._attach_shm(lambda v: allgather(store, f"{team_prefix}/shm{next(rounds)}", rank, size, v))
        return team

    def _attach_shm(self, allgather: Any) -> None:
        """Map a shared segment if every rank is on this host and PYCOLL_TLS allows ``shm``
        (collective: ``allgather(bytes) -> list[bytes]`` is the team's bootstrap exchange)."""
        from pycoll import config

        if self.size < 2:
            return
        tls = config.get("PYCOLL_TLS")
        from pycoll.tl.shm import shm_available

        wanted = "shm" in tls and shm_available()
        hosts = allgather(f"{socket.gethostname()}|{int(wanted)}".encode())
        if not all(h == hosts[0] for h in hosts) or not wanted:
            return
        from pycoll.tl.shm import ShmSegment

        self.shared = ShmSegment(self.rank, self.size, allgather)
        self.ctx.local_ranks(self.size)
        if self.ctx.oversubscribed:
            self.shared.polls = 64  # return to the engine soon: it yields the core
        from pycoll.tl.shm.transport import ShmTransport, cma_works

        # Point to point through the segment too, instead of TCP sockets. An MPI team keeps MPI for
        # point to point: MPICH already uses shared memory on a host, and its small messages cost
        # less than the descriptor protocol driven from Python (measured: 14 against 47 us).
        if self.transport.name == "tcp" and cma_works(self.shared, allgather):
            self.ctx.remove_transport(self.transport)
            self.transport.close()
            self.transport = ShmTransport(self.shared)
            self.ctx.add_transport(self.transport)

    def split(self, color: Optional[int], key: int = 0) -> Optional[Team]:
        """Split into sub-teams by ``color`` ordered by ``key`` (then rank), as ``MPI_Comm_split``;
        ranks passing ``color=None`` get ``None``. Collective over the team."""
        comm = getattr(self, "comm", None)
        if comm is None:
            raise TypeError(f"{self!r}: split needs a team made by Team.from_mpi")
        from mpi4py import MPI

        sub = comm.Split(MPI.UNDEFINED if color is None else int(color), int(key))
        if sub == MPI.COMM_NULL:
            return None
        try:
            return Team.from_mpi(sub, self.ctx)
        finally:
            sub.Free()


class Persistent:
    """A persistent collective (``team.allreduce_init(...)`` and the other ``_init`` calls): its
    schedule and scratch are built once; every ``start()`` runs it again on the same buffers
    (refill them between starts) and returns the Request of that run."""

    def __init__(self, team: Team, coll: str, src: np.ndarray, dst: np.ndarray, op: ReduceOp, root: int,
                 out: Any, priority: int, tag: Optional[Hashable], algorithm: Optional[str],
                 timeout: Optional[float], options: dict) -> None:
        self.team, self.coll = team, coll
        self._call = (src, dst, op, root, tag, algorithm, options)
        self._out, self._priority, self._timeout = out, priority, timeout
        self._task: Optional[Task] = None
        self.request: Optional[Request] = None

    def start(self) -> Request:
        """Run the collective once more (collective: every rank starts it)."""
        if self.request is not None and not self.request.done:
            raise RuntimeError(f"persistent {self.coll}: start() while the previous run is in progress")
        team = self.team
        src, dst, op, root, tag, algorithm, options = self._call
        task = self._task
        if task is None or not hasattr(task, "rebind") or task.state is not COMPLETED:
            task, key, shape = team._make(self.coll, src, dst, op, root, tag, algorithm, options, reuse=False)
            self._task = task if shape is not None else None
        else:
            key = team._coll_key(tag)
            task.rebind(src, dst, key)
        if self._task is not None:
            team._unit(task, key)
        self.request = team._submit(task, self._priority, self._timeout, self._out)
        return self.request

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Wait for the current run."""
        if self.request is None:
            raise RuntimeError(f"persistent {self.coll}: wait() before start()")
        return self.request.wait(timeout)

    def test(self) -> bool:
        return self.request is not None and self.request.test()

    def free(self) -> None:
        """Release the schedule and its scratch (MPI_Request_free)."""
        if self._task is not None:
            self._task.finalize()
            self._task = None


_store_teams = 0


def _local_address(store: Any) -> str:
    """The address of this host on the interface that reaches the store (else 127.0.0.1)."""
    sock = getattr(store, "_sock", None)
    if sock is not None:
        try:
            return sock.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"


def local_teams(n: int, ctx: Optional[Context] = None) -> List[Team]:
    """``n`` ranks inside this process, exchanging messages through memory and all run by one
    engine: test algorithms at any size without starting processes."""
    if n < 1:
        raise ValueError(f"local_teams needs n >= 1, got {n}")
    ctx = ctx if ctx is not None else Context()
    fabric = LocalFabric(n)
    return [Team(r, n, fabric.transport(r), ctx, name=f"local{n}") for r in range(n)]
