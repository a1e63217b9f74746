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
import os
import socket
from typing import Any, Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from pycoll import algorithms
from pycoll.algorithms.base import CollArgs, equal_layout
from pycoll.buffers import as_array, as_bytes
from pycoll.engine.context import Context, get_context
from pycoll.engine.request import Request
from pycoll.ops import ReduceOp, as_op, check_op
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import COMPLETED, Task
from pycoll.tl.base import Transport, TransportRequest
from pycoll.tl.local import LocalFabric
from pycoll.topology import Topology, node_key

_EMPTY = np.empty(0, np.uint8)

#: Finished collectives kept per call shape for reuse, and shapes remembered per team.
MAX_PLANS_PER_SHAPE = 4
MAX_PLAN_SHAPES = 64


class _Call(NamedTuple):
    """One checked collective call, what :meth:`Team._make` builds a task from."""

    coll: str
    src: np.ndarray
    dst: np.ndarray
    op: ReduceOp
    root: int
    out: Any  # what the request's wait() returns
    #: Bytes the selection table is looked up with: the same on every rank (the whole buffer of
    #: the block collectives; 0 where ranks can't know it: alltoallv, gatherv, scatterv).
    nbytes: int
    layout: Optional[Tuple[Tuple[int, int], ...]] = None  # v-collectives: the caller's blocks
    rlayout: Optional[Tuple[Tuple[int, int], ...]] = None


_BARRIER = _Call("barrier", _EMPTY, _EMPTY, ReduceOp.SUM, 0, None, 0)
_UNKEYED = ("unkeyed",)  # the key of a task being built, replaced before it runs


def _span(layout: Sequence[Tuple[int, int]]) -> int:
    """Elements covered by a layout's blocks (their total)."""
    return sum(c for _, c in layout)


def _equal_layout(call: _Call, n: int) -> Optional[List[Tuple[int, int]]]:
    """The blocks of a non-v block collective (None for the others)."""
    coll = call.coll
    if coll in ("allgather", "gather"):
        return equal_layout(call.src.size, n)
    if coll in ("reduce_scatter", "scatter"):
        return equal_layout(call.dst.size, n)
    if coll == "alltoall":
        return equal_layout(call.src.size // n, n)
    return None


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
        #: Which node each rank is on (from the bootstrap; None: not known, taken as one node).
        self.topology: Optional[Topology] = None
        self._node_team: Optional[Team] = None  # hierarchical teams: this rank's node team
        self._rail_team: Optional[Team] = None  # ... and the ranks with its local index on every node
        self._self_team: Optional[Team] = None
        #: Push-pull roles when the team's processes were started with summation servers
        #: (``PYCOLL_NUM_SERVERS``): the world team of workers and servers (see push_pull).
        self._ps: Any = None
        self._layouts: Dict[str, dict] = {}  # push_pull tensors seen: name -> layout
        self._async: Dict[str, Any] = {}  # async push_pull: this worker's colocated services
        self._serving: Optional[Task] = None  # keeps the progress thread on while they serve

    # ------------------------------------------------------------------ point to point
    def isend(self, buf: Any, peer: int, tag: Hashable = 0) -> TransportRequest:
        """Non-blocking send of ``buf`` to team rank ``peer``; ``req.test()`` says when done."""
        return self.transport.isend(as_bytes(buf), self._peer(peer), ("p", tag))

    def irecv(self, buf: Any, peer: int, tag: Hashable = 0) -> TransportRequest:
        """Non-blocking receive into ``buf`` from team rank ``peer``."""
        return self.transport.irecv(as_bytes(buf, writable=True), self._peer(peer), ("p", tag))

    def probe(self, peer: int, tag: Hashable = 0) -> bool:
        """Whether a message from team rank ``peer`` with ``tag`` waits for its receive."""
        return self.transport.probe(self._peer(peer), ("p", tag))

    def send(self, buf: Any, peer: int, tag: Hashable = 0, *, priority: int = 0,
             timeout: Optional[float] = None) -> Request:
        """Send ``buf`` to team rank ``peer`` as a task of the engine; returns a Request (done
        once the send completed locally: the buffer may be reused)."""
        from pycoll.tasks.p2p import SendTask

        task = SendTask(self, buf, self._peer(peer), tag, name=f"send->{peer}@{self.rank}")
        return self._submit(task, priority, timeout, None)

    def recv(self, buf: Any, peer: Optional[int] = None, tag: Hashable = 0, *, priority: int = 0,
             timeout: Optional[float] = None) -> Request:
        """Receive into ``buf`` from team rank ``peer`` (``None``: from any rank; the request's
        ``task.source`` then names it) as a task of the engine; returns a Request."""
        from pycoll.tasks.p2p import AnySourceRecvTask, RecvTask

        if peer is None:
            task: Task = AnySourceRecvTask(self, buf, tag, name=f"recv<-any@{self.rank}")
        else:
            task = RecvTask(self, buf, self._peer(peer), tag, name=f"recv<-{peer}@{self.rank}")
        return self._submit(task, priority, timeout, None)

    # ------------------------------------------------------------------ push-sum-pull (BytePS)
    @property
    def role(self) -> str:
        """``"worker"`` (server ranks never get a team: they run the server loop)."""
        return "worker"

    @property
    def workers(self) -> List[int]:
        """World ranks of the workers (the team's ranks, in order)."""
        return list(range(self.size))

    @property
    def servers(self) -> List[int]:
        """World ranks of the summation servers (``PYCOLL_NUM_SERVERS``; empty without)."""
        return list(range(self.size, self.size + self._ps.k)) if self._ps is not None else []

    def push_pull(self, buf: Any, recvbuf: Any = None, *, name: str, priority: int = 0,
                  average: bool = False, mode: str = "sync", timeout: Optional[float] = None) -> Request:
        """BytePS push-sum-pull of ``buf`` (into ``recvbuf``; ``None``: in place): an allreduce
        (SUM, or the mean with ``average``) whose partitions are summed by summation services,
        the colocated one of every worker and the team's CPU-only servers, placed by BytePS's
        optimal split (:mod:`pycoll.ps.placement`). ``name`` identifies the tensor across ranks
        and calls (equal on every rank; one call per name at a time). Partitions of
        ``PYCOLL_PARTITION_BYTES`` (4 MiB when unlimited); pushes take credit.

        ``mode="async"`` (BytePS's asynchronous training): the services keep the latest values of
        the tensor (starting at zero); ``buf`` is this worker's delta, added at once, and the
        current values come back into ``recvbuf`` (or ``buf``) without waiting for other workers.
        Workers keep serving until every worker closed its team."""
        from pycoll.algorithms import push_pull as pp
        from pycoll.ps.server import CONTROL, control_message
        from pycoll.tasks.p2p import SendTask

        if not isinstance(name, str) or not name:
            raise ValueError(f"push_pull needs a non-empty tensor name, got {name!r}")
        if mode not in ("sync", "async"):
            raise ValueError(f"push_pull mode must be 'sync' or 'async', got {mode!r}")
        if mode == "async" and average:
            raise ValueError("push_pull: average applies to sync mode (async adds deltas)")
        op = ReduceOp.AVG if average else ReduceOp.SUM
        call = self._allreduce_call(buf, recvbuf, op)
        src, dst = call.src.reshape(-1), call.dst.reshape(-1)
        pb = self.ctx.partition_bytes or (4 << 20)
        roles = self._ps if self._ps is not None else pp.Roles(self, self.size, 0)
        decl = dict(kind="decl", name=name, count=int(src.size), dtype=src.dtype.name,
                    partition_bytes=int(pb), op=op.name, mode=mode)
        known = self._layouts.get(name)
        if known is not None and known != decl:
            raise ValueError(f"push_pull: tensor {name!r} was {known['count']} x {known['dtype']} "
                             f"({known['op']}, partitions of {known['partition_bytes']} B), now "
                             f"{decl['count']} x {decl['dtype']} ({decl['op']}, "
                             f"{decl['partition_bytes']} B): a name keeps its layout; use another name")
        with self.ctx.lock:
            if mode == "async":
                service = self._async.get(name)
                if service is None:
                    service = self._async[name] = self._start_async_service(roles, name, src, pb)
                sched = pp.build_async(roles, self.rank, name, src, dst, service, pb, priority)
            else:
                sched = pp.build(roles, self.rank, name, src, dst, op, pb, priority)
            if known is None:
                self._layouts[name] = decl
                if roles.k and self.rank == 0:  # the servers learn the tensor with its first pushes
                    for s in range(roles.k):
                        sched.add(SendTask(roles.world, control_message(**decl), roles.n + s, CONTROL,
                                           name=f"declare {name}->server{s}"))
            return self._submit(sched, priority, timeout, call.out)

    def _start_async_service(self, roles: Any, name: str, src: np.ndarray, pb: int) -> Any:
        """This worker's colocated async service of ``name``, served in the background (the
        context's progress thread drives it while the worker computes)."""
        from pycoll.algorithms.push_pull import AsyncService
        from pycoll.engine.progress_thread import progress_thread
        from pycoll.ps.placement import plan

        mine = [p for p in plan(name, src.size, src.itemsize, roles.n, roles.k, pb)
                if not p.service.server and p.service.index == self.rank]
        service = AsyncService(roles, name, mine, src.dtype, self.rank)
        service.start()
        if self._serving is None:  # keep the progress thread driving until the team closes
            self._serving = _Forever(name=f"{self.name}: async services")
            progress_thread(self.ctx).watch([self.ctx.submit(self._serving)], lambda error: None)
        return service

    def _stop_async(self) -> None:
        """Serve the other workers until every worker got here, then stop serving."""
        if not self._async:
            return
        self.barrier(timeout=None).wait()
        with self.ctx.lock:
            for service in self._async.values():
                service.stop()
            self._async.clear()
            if self._serving is not None:
                self._serving.complete()
                self._serving = None

    def close(self) -> None:
        """Release the team's transport and shared segment (after its last collective)."""
        self._stop_async()
        if self._ps is not None:
            ps, self._ps = self._ps, None
            _say_goodbye(ps, self.rank)
            ps.world.close()
        for task in (t for pool in self._plans.values() for t in pool):
            task.finalize()
        self._plans.clear()
        for sub in (self._node_team, self._rail_team, self._self_team):
            if sub is not None and sub is not self:
                sub.close()
        self._node_team = self._rail_team = self._self_team = None
        self.ctx.remove_transport(self.transport)
        self.transport.close()
        if self.shared is not None:
            self.shared.close()
            self.shared = None

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

    # ------------------------------------------------------------------ hierarchy
    def node_team(self) -> Team:
        """The ranks of this rank's node (this team itself when it is on one node; a team of one
        when every node holds one of its ranks). Made with the team."""
        if self._node_team is not None:
            return self._node_team
        topo = self.topology
        if topo is None or topo.n_nodes == 1:
            return self
        return self._alone()

    def rail_team(self) -> Team:
        """The ranks whose index on their node equals this rank's, one per node that has that many
        (the leaders team for local index 0; the teams of split-rail allreduce)."""
        if self._rail_team is not None:
            return self._rail_team
        topo = self.topology
        if topo is not None and topo.n_nodes == self.size:
            return self  # one rank per node: every rank leads its node
        return self._alone()

    def leaders_team(self) -> Optional[Team]:
        """The lowest rank of every node, on those ranks; None on the others."""
        if self.topology is not None and self.topology.local_rank(self.rank) != 0:
            return None
        if self.topology is None and self.rank != 0:
            return None
        return self.rail_team()

    def _alone(self) -> Team:
        if self._self_team is None:
            from pycoll.tl.self import SelfTransport

            self._self_team = Team(0, 1, SelfTransport(), self.ctx, name=f"{self.name}/self{self.rank}")
        return self._self_team

    def task(self, coll: str, *args: Any, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
             **kwargs: Any) -> Task:
        """Build collective ``coll`` of this team as a task to add to a schedule, without
        submitting it: the levels of a hierarchical algorithm are such tasks on sub-teams (UCC's
        hierarchical task). Arguments as for the method of that name (``team.task("reduce",
        sendbuf, recvbuf, op, root)``). It takes its message key now, so build untagged ones in
        the same order on every rank.

        Such a task takes no credit: the engine's rule that a collective a peer started starts
        whatever the credit keeps ranks from waiting on each other only between independent
        collectives, and a schedule's dependencies between collectives can chain a rank's credit
        to work that waits on it (found with tagged hierarchical allreduces under 4 KiB of
        credit). Priority still orders them."""
        call = self._call_of(coll, args, kwargs)
        with self.ctx.lock:
            task, key, shape = self._make(call, tag, algorithm, {}, reuse=False, credit=False)
            if shape is not None:
                task.credit = 0
        return task

    # ------------------------------------------------------------------ collectives
    # Each collective is a pair: ``x(...)`` starts it and returns a Request, ``x_init(...)`` makes a
    # persistent one (MPI-4's ``MPI_X_init``) whose ``start()`` runs it again. Both check their
    # arguments in ``_x_call`` and raise before any message key is taken.

    def allreduce(self, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM, *, priority: int = 0,
                  tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                  timeout: Optional[float] = None, **options: Any) -> Request:
        """Start an allreduce of ``sendbuf`` into ``recvbuf`` (``None``: in place); returns a
        :class:`~pycoll.Request` whose ``wait()`` returns the output buffer.

        ``algorithm`` forces one (``rd``, ``ring``, ``knomial``, ``shm``; options such as
        ``radix=`` go to it); ``tag`` matches the collective across ranks by tag instead of
        posting order; ``priority`` orders it in the engine (lower first); ``timeout`` (seconds)
        overrides ``PYCOLL_TIMEOUT``. The other collectives take the same keywords.

        ``algorithm="push_pull"`` runs it as a BytePS push-sum-pull (:meth:`push_pull`; SUM or
        AVG) named after ``tag`` (untagged: after the collective's sequence number).
        """
        if algorithm == "push_pull":
            return self._allreduce_push_pull(sendbuf, recvbuf, op, priority, tag, timeout)
        return self._post(self._allreduce_call(sendbuf, recvbuf, op), priority, tag, algorithm, timeout,
                          options)

    def _allreduce_push_pull(self, sendbuf: Any, recvbuf: Any, op: Any, priority: int,
                             tag: Optional[Hashable], timeout: Optional[float]) -> Request:
        rop = op if type(op) is ReduceOp else as_op(op)
        if rop not in (ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(f"allreduce algorithm 'push_pull' sums (SUM or AVG), not {rop.name}")
        name = f"allreduce:{tag!r}" if tag is not None else f"allreduce#{next(self._seq)}"
        return self.push_pull(sendbuf, recvbuf, name=name, priority=priority, average=rop is ReduceOp.AVG,
                              timeout=timeout)

    def allreduce_init(self, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM, *, priority: int = 0,
                       tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                       timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent allreduce: built once, run by each ``start()``; the buffers may be
        refilled between starts."""
        return Persistent(self, self._allreduce_call(sendbuf, recvbuf, op), priority, tag, algorithm, timeout,
                          options)

    def _allreduce_call(self, sendbuf: Any, recvbuf: Any, op: Any) -> _Call:
        if type(op) is not ReduceOp:
            op = as_op(op)
        src, dst, out = self._elementwise(sendbuf, recvbuf, "allreduce")
        check_op(op, src.dtype)
        return _Call("allreduce", src, dst, op, 0, out, dst.nbytes)

    def bcast(self, buf: Any, root: int = 0, *, priority: int = 0, tag: Optional[Hashable] = None,
              algorithm: Optional[str] = None, timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a broadcast of ``buf`` from team rank ``root`` into ``buf`` on every rank."""
        return self._post(self._bcast_call(buf, root), priority, tag, algorithm, timeout, options)

    def bcast_init(self, buf: Any, root: int = 0, *, priority: int = 0, tag: Optional[Hashable] = None,
                   algorithm: Optional[str] = None, timeout: Optional[float] = None,
                   **options: Any) -> Persistent:
        """A persistent broadcast."""
        return Persistent(self, self._bcast_call(buf, root), priority, tag, algorithm, timeout, options)

    def _bcast_call(self, buf: Any, root: int) -> _Call:
        arr = as_bytes(buf, writable=True, what="buf")  # a broadcast moves bytes, whatever the type
        self._check_root(root, "bcast")
        return _Call("bcast", arr, arr, ReduceOp.SUM, root, buf, arr.nbytes)

    def barrier(self, *, priority: int = 0, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a barrier: its request completes once every rank of the team has entered it."""
        return self._post(_BARRIER, priority, tag, algorithm, timeout, options)

    def barrier_init(self, *, priority: int = 0, tag: Optional[Hashable] = None,
                     algorithm: Optional[str] = None, timeout: Optional[float] = None,
                     **options: Any) -> Persistent:
        """A persistent barrier."""
        return Persistent(self, _BARRIER, priority, tag, algorithm, timeout, options)

    def reduce(self, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM, root: int = 0, *,
               priority: int = 0, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
               timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a reduction of every rank's ``sendbuf`` into ``recvbuf`` on ``root`` (``None`` at
        the root: in place; ignored elsewhere)."""
        return self._post(self._reduce_call(sendbuf, recvbuf, op, root), priority, tag, algorithm, timeout,
                          options)

    def reduce_init(self, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM, root: int = 0, *,
                    priority: int = 0, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                    timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent reduce."""
        return Persistent(self, self._reduce_call(sendbuf, recvbuf, op, root), priority, tag, algorithm,
                          timeout, options)

    def _reduce_call(self, sendbuf: Any, recvbuf: Any, op: Any, root: int) -> _Call:
        op = as_op(op)
        self._check_root(root, "reduce")
        if self.rank == root:
            src, dst, out = self._elementwise(sendbuf, recvbuf, "reduce")
        else:
            src = dst = as_array(sendbuf, what="sendbuf")
            out = None
        check_op(op, src.dtype)
        return _Call("reduce", src, dst, op, root, out, src.nbytes)

    def allgather(self, sendbuf: Any, recvbuf: Any, *, priority: int = 0, tag: Optional[Hashable] = None,
                  algorithm: Optional[str] = None, timeout: Optional[float] = None,
                  **options: Any) -> Request:
        """Start an allgather: ``recvbuf`` gets every rank's ``sendbuf`` in rank order
        (``sendbuf=None``: in place, this rank's block of ``recvbuf`` is its contribution)."""
        return self._post(self._allgather_call(sendbuf, recvbuf), priority, tag, algorithm, timeout, options)

    def allgather_init(self, sendbuf: Any, recvbuf: Any, *, priority: int = 0, tag: Optional[Hashable] = None,
                       algorithm: Optional[str] = None, timeout: Optional[float] = None,
                       **options: Any) -> Persistent:
        """A persistent allgather."""
        return Persistent(self, self._allgather_call(sendbuf, recvbuf), priority, tag, algorithm, timeout,
                          options)

    def _allgather_call(self, sendbuf: Any, recvbuf: Any) -> _Call:
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        if dst.size % self.size:
            raise ValueError(f"allgather: recvbuf of {dst.size} elements is not {self.size} equal blocks")
        m = dst.size // self.size
        src = self._contribution(sendbuf, dst, (self.rank * m, m), "allgather")
        return _Call("allgather", src, dst, ReduceOp.SUM, 0, recvbuf, dst.nbytes)

    def allgatherv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                   displs: Optional[Sequence[int]] = None, *, priority: int = 0,
                   tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                   timeout: Optional[float] = None, **options: Any) -> Request:
        """Start an allgatherv: rank r contributes ``counts[r]`` elements, which land at
        ``displs[r]`` of every ``recvbuf`` (default: back to back in rank order); ``sendbuf=None``:
        in place, this rank's block of ``recvbuf`` is its contribution."""
        return self._post(self._allgatherv_call(sendbuf, recvbuf, counts, displs), priority, tag, algorithm,
                          timeout, options)

    def allgatherv_init(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                        displs: Optional[Sequence[int]] = None, *, priority: int = 0,
                        tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                        timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent allgatherv."""
        return Persistent(self, self._allgatherv_call(sendbuf, recvbuf, counts, displs), priority, tag,
                          algorithm, timeout, options)

    def _allgatherv_call(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                         displs: Optional[Sequence[int]]) -> _Call:
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        layout = self._layout(counts, displs, dst.size, "allgatherv", "recvbuf")
        src = self._contribution(sendbuf, dst, layout[self.rank], "allgatherv")
        return _Call("allgatherv", src, dst, ReduceOp.SUM, 0, recvbuf, _span(layout) * dst.itemsize, layout)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: Any = ReduceOp.SUM, *, priority: int = 0,
                       tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                       timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a reduce-scatter (block): rank r gets the reduction of block r of every rank's
        ``sendbuf`` (``team.size`` blocks of ``recvbuf``'s size)."""
        return self._post(self._reduce_scatter_call(sendbuf, recvbuf, op), priority, tag, algorithm, timeout,
                          options)

    def reduce_scatter_init(self, sendbuf: Any, recvbuf: Any, op: Any = ReduceOp.SUM, *, priority: int = 0,
                            tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                            timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent reduce-scatter (block)."""
        return Persistent(self, self._reduce_scatter_call(sendbuf, recvbuf, op), priority, tag, algorithm,
                          timeout, options)

    def _reduce_scatter_call(self, sendbuf: Any, recvbuf: Any, op: Any) -> _Call:
        op = as_op(op)
        src = as_array(sendbuf, what="sendbuf")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        self._check_blocks(src, dst, "reduce_scatter", "sendbuf", "recvbuf")
        check_op(op, src.dtype)
        return _Call("reduce_scatter", src, dst, op, 0, recvbuf, src.nbytes)

    def reduce_scatterv(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int], op: Any = ReduceOp.SUM, *,
                        priority: int = 0, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                        timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a reduce-scatterv (``MPI_Reduce_scatter``): ``sendbuf`` holds ``sum(counts)``
        elements, block r (``counts[r]`` elements, in rank order) is reduced into rank r's
        ``recvbuf``."""
        return self._post(self._reduce_scatterv_call(sendbuf, recvbuf, counts, op), priority, tag, algorithm,
                          timeout, options)

    def reduce_scatterv_init(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                             op: Any = ReduceOp.SUM, *, priority: int = 0, tag: Optional[Hashable] = None,
                             algorithm: Optional[str] = None, timeout: Optional[float] = None,
                             **options: Any) -> Persistent:
        """A persistent reduce-scatterv."""
        return Persistent(self, self._reduce_scatterv_call(sendbuf, recvbuf, counts, op), priority, tag,
                          algorithm, timeout, options)

    def _reduce_scatterv_call(self, sendbuf: Any, recvbuf: Any, counts: Sequence[int], op: Any) -> _Call:
        op = as_op(op)
        src = as_array(sendbuf, what="sendbuf")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        layout = self._layout(counts, None, src.size, "reduce_scatterv", "sendbuf")
        if src.dtype != dst.dtype or dst.size != layout[self.rank][1]:
            raise ValueError(f"reduce_scatterv: recvbuf ({dst.size} x {dst.dtype}) must hold "
                             f"counts[{self.rank}] = {layout[self.rank][1]} elements of {src.dtype}")
        check_op(op, src.dtype)
        return _Call("reduce_scatterv", src, dst, op, 0, recvbuf, _span(layout) * src.itemsize, layout)

    def alltoall(self, sendbuf: Any, recvbuf: Any, *, priority: int = 0, tag: Optional[Hashable] = None,
                 algorithm: Optional[str] = None, timeout: Optional[float] = None,
                 **options: Any) -> Request:
        """Start an alltoall: block j of ``sendbuf`` goes to rank j, which puts it in block r (this
        rank) of its ``recvbuf``."""
        return self._post(self._alltoall_call(sendbuf, recvbuf), priority, tag, algorithm, timeout, options)

    def alltoall_init(self, sendbuf: Any, recvbuf: Any, *, priority: int = 0, tag: Optional[Hashable] = None,
                      algorithm: Optional[str] = None, timeout: Optional[float] = None,
                      **options: Any) -> Persistent:
        """A persistent alltoall."""
        return Persistent(self, self._alltoall_call(sendbuf, recvbuf), priority, tag, algorithm, timeout,
                          options)

    def _alltoall_call(self, sendbuf: Any, recvbuf: Any) -> _Call:
        src = as_array(sendbuf, what="sendbuf")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        if src.dtype != dst.dtype or src.size != dst.size or src.size % self.size:
            raise ValueError(f"alltoall: sendbuf ({src.size} x {src.dtype}) and recvbuf ({dst.size} x "
                             f"{dst.dtype}) must be equal and hold {self.size} blocks")
        return _Call("alltoall", src, dst, ReduceOp.SUM, 0, recvbuf, src.nbytes)

    def alltoallv(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int], recvcounts: Sequence[int],
                  sdispls: Optional[Sequence[int]] = None, rdispls: Optional[Sequence[int]] = None, *,
                  priority: int = 0, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                  timeout: Optional[float] = None, **options: Any) -> Request:
        """Start an alltoallv: ``sendcounts[j]`` elements at ``sdispls[j]`` of ``sendbuf`` go to
        rank j, and ``recvcounts[i]`` elements from rank i land at ``rdispls[i]`` of ``recvbuf``
        (displacements default to back to back). ``recvcounts[i]`` must equal rank i's
        ``sendcounts[rank]``."""
        return self._post(self._alltoallv_call(sendbuf, recvbuf, sendcounts, recvcounts, sdispls, rdispls),
                          priority, tag, algorithm, timeout, options)

    def alltoallv_init(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int], recvcounts: Sequence[int],
                       sdispls: Optional[Sequence[int]] = None, rdispls: Optional[Sequence[int]] = None, *,
                       priority: int = 0, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                       timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent alltoallv."""
        return Persistent(self, self._alltoallv_call(sendbuf, recvbuf, sendcounts, recvcounts, sdispls,
                                                     rdispls), priority, tag, algorithm, timeout, options)

    def _alltoallv_call(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int],
                        recvcounts: Sequence[int], sdispls: Optional[Sequence[int]],
                        rdispls: Optional[Sequence[int]]) -> _Call:
        src = as_array(sendbuf, what="sendbuf")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        if src.dtype != dst.dtype:
            raise ValueError(f"alltoallv: sendbuf is {src.dtype}, recvbuf {dst.dtype}; they must match")
        layout = self._layout(sendcounts, sdispls, src.size, "alltoallv", "sendbuf", overlap=True)
        rlayout = self._layout(recvcounts, rdispls, dst.size, "alltoallv", "recvbuf")
        if layout[self.rank][1] != rlayout[self.rank][1]:
            raise ValueError(f"alltoallv: rank {self.rank} sends itself {layout[self.rank][1]} elements but "
                             f"expects {rlayout[self.rank][1]}")
        # sizes differ per rank, so every rank selects by team size alone (size 0)
        return _Call("alltoallv", src, dst, ReduceOp.SUM, 0, recvbuf, 0, layout, rlayout)

    def gather(self, sendbuf: Any, recvbuf: Any = None, root: int = 0, *, priority: int = 0,
               tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
               timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a gather of every rank's ``sendbuf`` into ``recvbuf`` on ``root`` (rank order;
        ``recvbuf`` is ignored on other ranks; ``sendbuf=None`` at the root: in place)."""
        return self._post(self._gather_call(sendbuf, recvbuf, root), priority, tag, algorithm, timeout,
                          options)

    def gather_init(self, sendbuf: Any, recvbuf: Any = None, root: int = 0, *, priority: int = 0,
                    tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                    timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent gather."""
        return Persistent(self, self._gather_call(sendbuf, recvbuf, root), priority, tag, algorithm, timeout,
                          options)

    def _gather_call(self, sendbuf: Any, recvbuf: Any, root: int) -> _Call:
        self._check_root(root, "gather")
        if self.rank != root:
            src = as_array(sendbuf, what="sendbuf")
            return _Call("gather", src, src, ReduceOp.SUM, root, None, src.nbytes * self.size)
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        if dst.size % self.size:
            raise ValueError(f"gather: recvbuf of {dst.size} elements is not {self.size} equal blocks")
        m = dst.size // self.size
        src = self._contribution(sendbuf, dst, (root * m, m), "gather")
        return _Call("gather", src, dst, ReduceOp.SUM, root, recvbuf, dst.nbytes)

    def gatherv(self, sendbuf: Any, recvbuf: Any = None, counts: Optional[Sequence[int]] = None,
                displs: Optional[Sequence[int]] = None, root: int = 0, *, priority: int = 0,
                tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a gatherv: rank r's ``sendbuf`` (``counts[r]`` elements) lands at ``displs[r]``
        of ``recvbuf`` on ``root``. ``counts`` is needed at the root; tree algorithms (``knomial``)
        need it on every rank, ``linear`` (the default) only at the root."""
        return self._post(self._gatherv_call(sendbuf, recvbuf, counts, displs, root), priority, tag,
                          algorithm, timeout, options)

    def gatherv_init(self, sendbuf: Any, recvbuf: Any = None, counts: Optional[Sequence[int]] = None,
                     displs: Optional[Sequence[int]] = None, root: int = 0, *, priority: int = 0,
                     tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                     timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent gatherv."""
        return Persistent(self, self._gatherv_call(sendbuf, recvbuf, counts, displs, root), priority, tag,
                          algorithm, timeout, options)

    def _gatherv_call(self, sendbuf: Any, recvbuf: Any, counts: Optional[Sequence[int]],
                      displs: Optional[Sequence[int]], root: int) -> _Call:
        self._check_root(root, "gatherv")
        if self.rank != root:
            src = as_array(sendbuf, what="sendbuf")
            layout = None
            if counts is not None:
                layout = self._layout(counts, displs, None, "gatherv", "recvbuf")
                if layout[self.rank][1] != src.size:
                    raise ValueError(f"gatherv: sendbuf holds {src.size} elements, counts[{self.rank}] is "
                                     f"{layout[self.rank][1]}")
            return _Call("gatherv", src, src, ReduceOp.SUM, root, None, 0, layout)
        if counts is None:
            raise ValueError("gatherv: the root needs counts")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        layout = self._layout(counts, displs, dst.size, "gatherv", "recvbuf")
        src = self._contribution(sendbuf, dst, layout[root], "gatherv")
        return _Call("gatherv", src, dst, ReduceOp.SUM, root, recvbuf, 0, layout)

    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, priority: int = 0,
                tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a scatter: block r of ``sendbuf`` on ``root`` goes to ``recvbuf`` of rank r
        (``sendbuf`` is ignored on other ranks; ``recvbuf=None`` at the root: in place)."""
        return self._post(self._scatter_call(sendbuf, recvbuf, root), priority, tag, algorithm, timeout,
                          options)

    def scatter_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, priority: int = 0,
                     tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                     timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent scatter."""
        return Persistent(self, self._scatter_call(sendbuf, recvbuf, root), priority, tag, algorithm, timeout,
                          options)

    def _scatter_call(self, sendbuf: Any, recvbuf: Any, root: int) -> _Call:
        self._check_root(root, "scatter")
        if self.rank != root:
            dst = as_array(recvbuf, writable=True, what="recvbuf")
            return _Call("scatter", dst, dst, ReduceOp.SUM, root, recvbuf, dst.nbytes * self.size)
        src = as_array(sendbuf, what="sendbuf")
        if src.size % self.size:
            raise ValueError(f"scatter: sendbuf of {src.size} elements is not {self.size} equal blocks")
        m = src.size // self.size
        dst = self._own_output(recvbuf, src, (root * m, m), "scatter")
        return _Call("scatter", src, dst, ReduceOp.SUM, root, recvbuf if recvbuf is not None else dst,
                     src.nbytes)

    def scatterv(self, sendbuf: Any, recvbuf: Any, counts: Optional[Sequence[int]] = None,
                 displs: Optional[Sequence[int]] = None, root: int = 0, *, priority: int = 0,
                 tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                 timeout: Optional[float] = None, **options: Any) -> Request:
        """Start a scatterv: ``counts[r]`` elements at ``displs[r]`` of ``sendbuf`` on ``root`` go
        to rank r's ``recvbuf``. ``counts`` as for :meth:`gatherv`."""
        return self._post(self._scatterv_call(sendbuf, recvbuf, counts, displs, root), priority, tag,
                          algorithm, timeout, options)

    def scatterv_init(self, sendbuf: Any, recvbuf: Any, counts: Optional[Sequence[int]] = None,
                      displs: Optional[Sequence[int]] = None, root: int = 0, *, priority: int = 0,
                      tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
                      timeout: Optional[float] = None, **options: Any) -> Persistent:
        """A persistent scatterv."""
        return Persistent(self, self._scatterv_call(sendbuf, recvbuf, counts, displs, root), priority, tag,
                          algorithm, timeout, options)

    def _scatterv_call(self, sendbuf: Any, recvbuf: Any, counts: Optional[Sequence[int]],
                       displs: Optional[Sequence[int]], root: int) -> _Call:
        self._check_root(root, "scatterv")
        if self.rank != root:
            dst = as_array(recvbuf, writable=True, what="recvbuf")
            layout = None
            if counts is not None:
                layout = self._layout(counts, displs, None, "scatterv", "sendbuf", overlap=True)
                if layout[self.rank][1] != dst.size:
                    raise ValueError(f"scatterv: recvbuf holds {dst.size} elements, counts[{self.rank}] is "
                                     f"{layout[self.rank][1]}")
            return _Call("scatterv", dst, dst, ReduceOp.SUM, root, recvbuf, 0, layout)
        if counts is None:
            raise ValueError("scatterv: the root needs counts")
        src = as_array(sendbuf, what="sendbuf")
        layout = self._layout(counts, displs, src.size, "scatterv", "sendbuf", overlap=True)
        dst = self._own_output(recvbuf, src, layout[root], "scatterv")
        return _Call("scatterv", src, dst, ReduceOp.SUM, root, recvbuf if recvbuf is not None else dst, 0,
                     layout)

    # ------------------------------------------------------------------ argument checks
    @staticmethod
    def _elementwise(sendbuf: Any, recvbuf: Any, coll: str) -> tuple:
        """(src, dst, what wait() returns) of an elementwise collective; ``recvbuf=None``: in place."""
        if recvbuf is None:
            src = dst = as_array(sendbuf, writable=True, what="sendbuf (in place)")
            return src, dst, sendbuf
        src = as_array(sendbuf, what="sendbuf")
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        if src.dtype != dst.dtype or src.size != dst.size:
            raise ValueError(f"{coll}: sendbuf is {src.size} x {src.dtype}, recvbuf {dst.size} x "
                             f"{dst.dtype}; they must match")
        return src, dst, recvbuf

    def _check_blocks(self, whole: np.ndarray, block: np.ndarray, coll: str, whole_name: str,
                      block_name: str) -> None:
        if whole.dtype != block.dtype or whole.size != self.size * block.size:
            raise ValueError(f"{coll}: {whole_name} ({whole.size} x {whole.dtype}) must hold {self.size} "
                             f"blocks of {block_name} ({block.size} x {block.dtype})")

    def _contribution(self, sendbuf: Any, dst: np.ndarray, block: Tuple[int, int], coll: str) -> np.ndarray:
        """This rank's input to a gathering collective: ``sendbuf``, or (``None``: in place) its
        ``block`` of ``dst``."""
        off, cnt = block
        if sendbuf is None:
            return dst[off:off + cnt]
        src = as_array(sendbuf, what="sendbuf")
        if src.dtype != dst.dtype or src.size != cnt:
            raise ValueError(f"{coll}: sendbuf ({src.size} x {src.dtype}) must be rank {self.rank}'s "
                             f"block of recvbuf ({cnt} x {dst.dtype})")
        return src

    def _own_output(self, recvbuf: Any, src: np.ndarray, block: Tuple[int, int], coll: str) -> np.ndarray:
        """The root's output of a scattering collective: ``recvbuf``, or (``None``: in place) its
        block of ``src`` (left where it is)."""
        off, cnt = block
        if recvbuf is None:
            return src[off:off + cnt]
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        if src.dtype != dst.dtype or dst.size != cnt:
            raise ValueError(f"{coll}: recvbuf ({dst.size} x {dst.dtype}) must hold the root's block of "
                             f"sendbuf ({cnt} x {src.dtype})")
        return dst

    def _layout(self, counts: Sequence[int], displs: Optional[Sequence[int]], room: Optional[int], coll: str,
                what: str, overlap: bool = False) -> Tuple[Tuple[int, int], ...]:
        """Checked ``((displ, count), ...)`` per rank of a v-collective's buffer of ``room``
        elements (None: not known on this rank). Receive blocks may not overlap (as in MPI)."""
        n = self.size
        try:
            counts = [int(c) for c in counts]
            displs = None if displs is None else [int(d) for d in displs]
        except (TypeError, ValueError):
            raise TypeError(f"{coll}: counts and displs must be sequences of integers") from None
        if len(counts) != n or (displs is not None and len(displs) != n):
            raise ValueError(f"{coll}: counts and displs need one entry per rank ({n}), got {len(counts)} "
                             f"and {'none' if displs is None else len(displs)}")
        if displs is None:
            displs = list(itertools.accumulate([0] + counts[:-1]))
        for r, (d, c) in enumerate(zip(displs, counts)):
            if c < 0 or d < 0 or (room is not None and d + c > room):
                raise ValueError(f"{coll}: block of rank {r} ({c} elements at {d}) does not fit {what} of "
                                 f"{room} elements")
        if not overlap:
            end = 0
            for d, c in sorted((d, c) for d, c in zip(displs, counts) if c):
                if d < end:
                    raise ValueError(f"{coll}: blocks of {what} overlap at element {d}")
                end = d + c
        return tuple(zip(displs, counts))

    def _check_root(self, root: int, coll: str) -> None:
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise ValueError(f"{coll}: root {root!r} is not a rank of a team of {self.size}")

    # ------------------------------------------------------------------ building and posting
    def _post(self, call: _Call, priority: int, tag: Optional[Hashable], algorithm: Optional[str],
              timeout: Optional[float], options: dict) -> Request:
        """Build (or reuse) the collective's task and submit it. Everything the caller passed has
        been checked: nothing here fails before the message key is taken. Under the engine's lock:
        a progress thread may be returning finished collectives to this team's pool meanwhile."""
        with self.ctx.lock:
            task, key, shape = self._make(call, tag, algorithm, options, reuse=True)
            if shape is None:  # partitioned: a schedule of parts, each its own unit of credit
                return self._submit(task, priority, timeout, call.out)
            return self._submit(self._unit(task, key), priority, timeout, call.out, shape)

    def submit(self, coll: str, *args: Any, priority: int = 0, tag: Optional[Hashable] = None,
               algorithm: Optional[str] = None, timeout: Optional[float] = None, name: Optional[str] = None,
               credit: bool = True, **kwargs: Any) -> Request:
        """Start collective ``coll`` by name (``team.submit("allreduce", buf, None, op)`` is
        ``team.allreduce(buf, None, op)``): what the scheduling layer posts through.

        ``name`` labels the task in traces and errors (a gradient's name); ``credit=False`` makes
        a collective that takes no credit (the scheduler's "immediate" tensors, control
        messages), started by priority alone."""
        call = self._call_of(coll, args, kwargs)
        with self.ctx.lock:
            if not credit:
                task, key, shape = self._make(call, tag, algorithm, {}, reuse=False, credit=False)
                task.credit = 0
                shape = None
            else:
                task, key, shape = self._make(call, tag, algorithm, {}, reuse=True)
                if shape is not None:
                    task = self._unit(task, key)
            if name is not None:
                task.name = name
            return self._submit(task, priority, timeout, call.out, shape)

    def _call_of(self, coll: str, args: tuple, kwargs: dict) -> _Call:
        """The checked call of collective ``coll`` by name (``task`` and ``submit``)."""
        if coll == "barrier":
            return _BARRIER
        check = getattr(self, f"_{coll}_call", None)
        if check is None:
            raise ValueError(f"unknown collective {coll!r}")
        return check(*args, **kwargs)

    def _make(self, call: _Call, tag: Optional[Hashable], algorithm: Optional[str], options: dict,
              reuse: bool, credit: bool = True) -> tuple:
        """``(task, key, shape)`` of a new collective: a finished task of the same shape rebound
        to these buffers and a new key (``reuse``), or a new one; ``shape`` is None for a
        partitioned collective (which is never reused)."""
        coll, src, dst = call.coll, call.src, call.dst
        if algorithm is None:
            nbytes = call.nbytes
            name = self._selected.get((coll, nbytes, tag is None)) or self._select(coll, nbytes, tag)
        else:
            name = algorithm
        shape = (coll, name, dst.size, src.size, dst.dtype, id(call.op), src is dst, call.root, call.layout,
                 call.rlayout, tuple(sorted(options.items())) if options else ())
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
        pb = self.ctx.partition_bytes
        if coll == "allreduce" and pb and dst.nbytes > pb and self.size > 1:
            key = self._coll_key(tag)
            return self._partitioned(build, call, key, pb, name, options, credit), key, None
        args = self._args(call, _UNKEYED, name, options)
        if tag is not None:  # the key _coll_key takes next: hierarchical algorithms derive theirs from it
            args.tag = ("u", tag, self._tag_uses.get(tag, 0))
        task = build(args)  # a builder that rejects its arguments raises before a key is taken
        key = self._coll_key(tag)
        args.channel.rekey(key)
        return task, key, shape

    def _select(self, coll: str, nbytes: int, tag: Optional[Hashable]) -> str:
        seg = self.shared
        name = algorithms.select(coll, self.size, nbytes, shared=seg is not None and tag is None,
                                 cma=seg is not None and seg.cma, hier=self._node_team is not None)
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

    def _args(self, call: _Call, key: tuple, name: str, options: dict) -> CollArgs:
        layout, rlayout = call.layout, call.rlayout
        if layout is None:
            layout = rlayout = _equal_layout(call, self.size)
        return CollArgs(call.coll, self.rank, self.size, self.transport.channel(key), call.src, call.dst,
                        call.op, call.root, name=f"{call.coll}:{name}@{self.rank}", options=options,
                        shared=self.shared, layout=layout, rlayout=rlayout, team=self,
                        tag=key if key[0] == "u" else None)

    def _partitioned(self, build: Any, call: _Call, key: tuple, part_bytes: int, name: str,
                     options: dict, credit: bool = True) -> Task:
        """An elementwise collective as independent parts of at most ``part_bytes`` (same key plus
        the part index): large work split so that urgent collectives can go in between."""
        src, dst = call.src, call.dst
        per = max(1, part_bytes // dst.itemsize)
        sched = Schedule(name=f"{call.coll}#{key[1]}/parts@{self.rank}")
        for i, lo in enumerate(range(0, dst.size, per)):
            sl = slice(lo, lo + per)
            part_key = (*key, "part", i)
            part = call._replace(src=src[sl], dst=dst[sl])
            task = build(self._args(part, part_key, name, options))
            if credit:
                self._unit(task, part_key)
            else:
                task.credit = 0
            sched.add(task)
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

    # ------------------------------------------------------------------ traffic accounting
    def traffic(self, *, include_self: bool = True, subteams: bool = True) -> Dict[Any, Dict[str, int]]:
        """Payload bytes and messages this rank moved since the team was made (or since
        :meth:`reset_traffic`): ``{peer: {"sent": B, "received": B, "msgs_sent": n,
        "msgs_received": n}}`` for every team rank ``peer``, plus their sums under ``"total"``.

        The transports count (see :class:`pycoll.tl.base.Traffic`): payload only, not their headers;
        a send when handed to the wire, a receive when it completes. This rank's own entry holds its
        messages to itself, which cross no NIC: ``include_self=False`` leaves it out of the peers and
        the total. ``subteams``: add what the node, rail and one-rank sub-teams of hierarchical
        algorithms moved over their own transports, under their peers' ranks in this team. Data
        moved through the host's shared segment (the shm algorithms) or read from peers' memory by
        the cma allgather is not counted.
        """
        with self.ctx.lock:
            out = {r: dict.fromkeys(("sent", "received", "msgs_sent", "msgs_received"), 0)
                   for r in range(self.size)}
            parts: List[Tuple[Dict[Any, Dict[str, int]], Sequence[int]]] = [
                (self.transport.traffic.snapshot(), range(self.size))]
            topo = self.topology
            if subteams and topo is not None:
                for sub, ranks in ((self._node_team, lambda: topo.members(topo.nodes[self.rank])),
                                   (self._rail_team, lambda: topo.rail(topo.local_rank(self.rank))),
                                   (self._self_team, lambda: [self.rank])):
                    if sub is not None and sub is not self:
                        members = ranks()
                        if len(members) == sub.size:
                            parts.append((sub.traffic(), members))
            for counts, members in parts:
                for peer, figures in counts.items():
                    if peer != "total":
                        mine = out[members[peer]]
                        for field, value in figures.items():
                            mine[field] += value
            if not include_self:
                del out[self.rank]
            total = dict.fromkeys(("sent", "received", "msgs_sent", "msgs_received"), 0)
            for figures in out.values():
                for field, value in figures.items():
                    total[field] += value
            out["total"] = total  # type: ignore[index]
            return out

    def reset_traffic(self) -> None:
        """Count traffic from zero again (this team's transport and its sub-teams')."""
        with self.ctx.lock:
            self.transport.traffic.reset()
            for sub in (self._node_team, self._rail_team, self._self_team):
                if sub is not None and sub is not self:
                    sub.reset_traffic()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mpi(cls, comm: Any, ctx: Optional[Context] = None, *,
                 tls: Optional[Sequence[str]] = None, roles: bool = True) -> Team:
        """A team over an mpi4py intracommunicator (``COMM_WORLD`` or any sub-communicator).

        The communicator is duplicated, so pycoll's messages never meet the caller's. Collective
        over ``comm``: every rank calls it. ``tls`` overrides ``PYCOLL_TLS`` for this team.

        With ``PYCOLL_NUM_SERVERS=K`` (``pycoll run --servers K``) and ``COMM_WORLD``, the last K
        ranks are summation servers: they run the server loop here and exit when the workers are
        done; the workers get a team of the workers only, whose ``push_pull`` uses the servers.
        """
        from mpi4py import MPI

        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"Team.from_mpi needs an mpi4py intracommunicator, got {comm!r}")
        if roles and _num_servers() and MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT):
            return cls._with_servers(comm, ctx, tls, _num_servers())
        dup = comm.Dup()
        ctx = ctx if ctx is not None else get_context()
        if dup.Get_size() == 1:
            from pycoll.tl.self import SelfTransport

            transport: Transport = SelfTransport()
        else:
            from pycoll.tl.mpi import MPITransport

            transport = (_p2p_transport("mpi", dup.Get_rank(), dup.Get_size(), dup.allgather, ctx, tls)
                         or MPITransport(dup))
            ctx.add_transport(transport)
        name = comm.Get_name() or "mpi"
        team = cls(dup.Get_rank(), dup.Get_size(), transport, ctx, name=name)
        team.comm = dup
        team._attach_shm(lambda value: dup.allgather(value), tls)
        topo = team.topology
        if topo is not None and topo.hierarchical:
            rank = team.rank
            levels = (("node", topo.nodes[rank], _level_tls("PYCOLL_NODE_TLS", tls)),
                      ("rail", topo.local_rank(rank), _level_tls("PYCOLL_LEADER_TLS", tls)))
            for level, color, sub_tls in levels:
                sub = dup.Split(color, rank)
                try:
                    made = Team.from_mpi(sub, ctx, tls=sub_tls)
                finally:
                    sub.Free()
                made.name = f"{name}/{level}{color}"
                setattr(team, f"_{level}_team", made)
        return team

    @classmethod
    def _with_servers(cls, comm: Any, ctx: Optional[Context], tls: Optional[Sequence[str]], k: int) -> Team:
        """Workers and servers: the world team, then the workers' team (servers serve and exit)."""
        import atexit

        from pycoll.algorithms.push_pull import Roles

        size, rank = comm.Get_size(), comm.Get_rank()
        n = size - k
        if n < 1:
            raise ValueError(f"PYCOLL_NUM_SERVERS={k} leaves no worker among {size} ranks")
        world = cls.from_mpi(comm, ctx, tls=tls, roles=False)
        world.name = "world"
        sub = world.comm.Split(1 if rank >= n else 0, rank)
        try:
            if rank >= n:
                from pycoll.ps.server import serve

                serve(world, n, k, rank - n)
                raise SystemExit(0)
            team = cls.from_mpi(sub, ctx, tls=tls, roles=False)
        finally:
            sub.Free()
        team.name = "workers"
        team._ps = Roles(world, n, k)
        atexit.register(team._goodbye_at_exit)
        return team

    def _goodbye_at_exit(self) -> None:
        self._stop_async()
        if self._ps is not None:
            ps, self._ps = self._ps, None
            _say_goodbye(ps, self.rank)

    @classmethod
    def from_store(cls, store: Any, rank: int, size: int, ctx: Optional[Context] = None, *,
                   prefix: str = "pycoll", advertise: Optional[str] = None,
                   tls: Optional[Sequence[str]] = None) -> Team:
        """A team bootstrapped through a key-value store (pycoll's :class:`~pycoll.store.TCPStore`
        or a torch c10d ``Store``): ranks exchange addresses in the store and connect with TCP.

        Collective: all ``size`` ranks call it, in the same order if they make several teams.
        ``advertise`` is the address peers use to reach this rank (default: the address this
        host uses to reach the store, or 127.0.0.1). ``tls`` overrides ``PYCOLL_TLS`` for this team.
        """
        from pycoll.store import allgather
        from pycoll.tl.base import key_hash

        if not 0 <= rank < size:
            raise ValueError(f"from_store: rank {rank} is not in a team of {size}")
        _store_teams[prefix] = _store_teams.get(prefix, 0) + 1
        team_prefix = f"{prefix}/team{_store_teams[prefix]}"
        ctx = ctx if ctx is not None else get_context()
        if size == 1:
            from pycoll.tl.self import SelfTransport

            transport: Transport = SelfTransport()
        else:
            from pycoll.tl.tcp import TCPTransport, connect_mesh

            exchanges = itertools.count()

            def exchange(value: bytes) -> List[bytes]:  # a fresh key per round: transports call it again
                return allgather(store, f"{team_prefix}/addr{next(exchanges)}", rank, size, value)

            chosen = _p2p_transport("tcp", rank, size, exchange, ctx, tls)
            if chosen is None:
                if advertise is None:
                    advertise = _local_address(store)
                socks = connect_mesh(rank, size, exchange, key_hash(team_prefix), advertise=advertise)
                chosen = TCPTransport(rank, size, socks)
            transport = chosen
            ctx.add_transport(transport)
        team = cls(rank, size, transport, ctx, name=team_prefix)
        team.store = store
        rounds = itertools.count()
        team._attach_shm(lambda v: allgather(store, f"{team_prefix}/shm{next(rounds)}", rank, size, v), tls)
        topo = team.topology
        if topo is not None and topo.hierarchical:
            for level, members, color, sub_tls in (
                    ("node", topo.members(topo.nodes[rank]), topo.nodes[rank],
                     _level_tls("PYCOLL_NODE_TLS", tls)),
                    ("rail", topo.rail(topo.local_rank(rank)), topo.local_rank(rank),
                     _level_tls("PYCOLL_LEADER_TLS", tls))):
                made = Team.from_store(store, members.index(rank), len(members), ctx, advertise=advertise,
                                       prefix=f"{team_prefix}/{level}{color}", tls=sub_tls)
                setattr(team, f"_{level}_team", made)
        return team

    def _attach_shm(self, allgather: Any, tls: Optional[Sequence[str]] = None) -> None:
        """Learn which node every rank is on (:attr:`topology`) and map a shared segment if all
        ranks are on one node and ``tls`` (PYCOLL_TLS) allows ``shm`` (collective:
        ``allgather(bytes) -> list[bytes]`` is the team's bootstrap exchange)."""
        from pycoll import config

        if self.size < 2:
            self.topology = Topology((0,))
            return
        if tls is None:
            tls = config.get("PYCOLL_TLS")
        from pycoll.tl.shm import shm_available

        wanted = "shm" in tls and shm_available()
        infos = [v.decode().rsplit("|", 1) for v in allgather(f"{node_key()}|{int(wanted)}".encode())]
        self.topology = Topology.from_keys([key for key, _ in infos])
        if self.topology.n_nodes > 1 or not all(w == "1" for _, w in infos):
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
        self.shared.cma = cma_works(self.shared, allgather)
        if self.transport.name == "tcp" and self.shared.cma:
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

    def __init__(self, team: Team, call: _Call, priority: int, tag: Optional[Hashable],
                 algorithm: Optional[str], timeout: Optional[float], options: dict) -> None:
        self.team, self.coll = team, call.coll
        self._call = call
        self._tag, self._algorithm, self._options = tag, algorithm, options
        self._priority, self._timeout = priority, timeout
        self._task: Optional[Task] = None
        self.request: Optional[Request] = None

    def start(self) -> Request:
        """Run the collective once more (collective: every rank starts it)."""
        if self.request is not None and not self.request.done:
            raise RuntimeError(f"persistent {self.coll}: start() while the previous run is in progress")
        team, call, tag = self.team, self._call, self._tag
        with team.ctx.lock:
            task = self._task
            if task is None or not hasattr(task, "rebind") or task.state is not COMPLETED:
                task, key, shape = team._make(call, tag, self._algorithm, self._options, reuse=False)
                self._task = task if shape is not None else None
            else:
                key = team._coll_key(tag)
                task.rebind(call.src, call.dst, key)
            if self._task is not None:
                team._unit(task, key)
            self.request = team._submit(task, self._priority, self._timeout, call.out)
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


def _p2p_transport(default: str, rank: int, size: int, allgather: Any, ctx: Context,
                   tls: Optional[Sequence[str]] = None) -> Optional[Transport]:
    """The point-to-point transport ``tls`` (PYCOLL_TLS) asks for instead of the bootstrap's own
    (``default``: ``mpi`` or ``tcp``), or None to use that. UCX is taken when it is listed before
    ``default`` (or ``default`` is not listed); ``allgather(bytes) -> list[bytes]`` exchanges
    worker addresses."""
    from pycoll import config

    if tls is None:
        tls = config.get("PYCOLL_TLS")
    if "ucx" in tls and (default not in tls or tls.index("ucx") < tls.index(default)):
        from pycoll.tl.ucx import UCXTransport

        return UCXTransport(rank, size, allgather, ctx)
    return None


def _level_tls(setting: str, tls: Optional[Sequence[str]]) -> Optional[Sequence[str]]:
    """The transports of a level of sub-teams: its setting, else the parent's ``tls``."""
    from pycoll import config

    return config.get(setting) or tls


#: Teams made per store prefix: the n-th team of a prefix is named ``prefix/team<n>`` on every rank.
_store_teams: Dict[str, int] = {}


def _local_address(store: Any) -> str:
    """The address of this host on the interface that reaches the store (else 127.0.0.1)."""
    sock = getattr(store, "_sock", None)
    if sock is not None:
        try:
            return sock.getsockname()[0]
        except OSError:
            pass
    master = os.environ.get("MASTER_ADDR")  # a c10d store: the host torch's launcher names
    if master and master not in ("localhost", "127.0.0.1", "::1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
                return probe.getsockname()[0]
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
    teams = [Team(r, n, fabric.transport(r), ctx, name=f"local{n}") for r in range(n)]
    topo = Topology.from_keys([node_key(r) for r in range(n)])  # PYCOLL_RANKS_PER_NODE by team rank
    for team in teams:
        team.topology = topo
    if topo.hierarchical:  # in-process sub-teams: one fabric per node and per rail
        for level, groups in (("node", [topo.members(i) for i in range(topo.n_nodes)]),
                              ("rail", [topo.rail(i) for i in range(max(topo.ppn))])):
            for i, members in enumerate(groups):
                sub = LocalFabric(len(members))
                for j, r in enumerate(members):
                    made = Team(j, len(members), sub.transport(j), ctx, name=f"local{n}/{level}{i}")
                    made.topology = Topology(tuple(range(len(members))) if level == "rail"
                                             else (0,) * len(members))
                    setattr(teams[r], f"_{level}_team", made)
    return teams


def _num_servers() -> int:
    from pycoll import config

    return config.get("PYCOLL_NUM_SERVERS")


def _say_goodbye(ps: Any, me: int) -> None:
    """Worker ``me`` is done with push-pull: tell the servers (they exit once all workers did)."""
    if ps.k:
        from pycoll.ps.server import goodbye

        goodbye(ps.world, ps.n, ps.k, me)


class _Forever(Task):
    """A task that stays in progress until completed from outside (keeps a progress thread
    driving background services)."""

    takes_credit = False
    polled = False

    def post(self) -> None:
        pass
