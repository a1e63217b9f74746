"""Teams: a group of ranks that run collectives together (UCC's team, MPI's communicator).

``Team`` is the face users hold; the work is done by the rooms it delegates to:

* the collective methods (``team.allreduce``, ``team.allreduce_init``, ...) are made from the
  table of collectives (:mod:`pycoll.collectives`): each checks its arguments
  (:mod:`pycoll.calls`) and hands the checked call to the team's :class:`~pycoll.planner.Planner`
  (selection, plan cache, credit, partitioning, submission);
* :mod:`pycoll.bootstrap` makes teams (from MPI, from a store, in process, by split);
* :mod:`pycoll.persistent` runs the ``_init`` collectives, :mod:`pycoll.ps.worker` push-pull,
  :mod:`pycoll.traffic` sums traffic counters, :mod:`pycoll.tasks.p2p` point to point.

Messages are keyed by tags the team builds: user point-to-point messages by ``("p", tag)``,
collectives by ``("c", sequence number)`` or ``("u", user tag, use)``, so concurrent collectives on
one team never match each other's messages.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Union

from pycoll import arrays, bootstrap, recovery
from pycoll.buffers import as_bytes
from pycoll.calls import Call
from pycoll.collectives import TABLE, Collective, docstring
from pycoll.collectives import get as collective
from pycoll.engine.context import Context, get_context
from pycoll.engine.request import Finished, Request
from pycoll.ops import ReduceOp
from pycoll.persistent import Persistent, buffer_dtype, persistent_of, repeat_test, sequence_values
from pycoll.planner import Planner
from pycoll.ps.worker import PushPull
from pycoll.tasks.p2p import AnySourceRecvTask, RecvTask, SendTask, raw_inside_task
from pycoll.tasks.task import Task
from pycoll.tl.base import Channel, Transport
from pycoll.tl.self import SelfTransport
from pycoll.topology import Levels, Topology
from pycoll.traffic import reset_traffic, team_traffic


class Team:
    """``size`` ranks running collectives together; this object is rank ``rank``'s end.

    Every collective of :mod:`pycoll.collectives` is a method (``team.allreduce(sendbuf, recvbuf,
    op)``) that starts it and returns a :class:`~pycoll.Request`, with a persistent form
    (``team.allreduce_init(...)``). Algorithms reach peers only through the team's transport
    channels, never a transport directly.
    """

    def __init__(self, rank: int, size: int, transport: Transport, ctx: Optional[Context] = None, *,
                 name: str = "team") -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a team of {size}")
        self.rank, self.size, self.transport = rank, size, transport
        self.ctx = ctx if ctx is not None else get_context()
        self.name = name
        #: The node-shared segment when all ranks share a host and shm is enabled (else None).
        self.shared: Any = None
        #: Which node each rank is on (from the bootstrap; None: not known, taken as one node).
        self.topology: Optional[Topology] = None
        self.levels = Levels()
        self.planner = Planner(self)
        #: The calls remembered for their repeats (the planner's :class:`~pycoll.persistent.RecentCalls`).
        self.recent = self.planner.recent
        #: Push-sum-pull of this team of workers (with the servers, when started with some).
        self.ps = PushPull(self)
        self.recovery: Optional[recovery.Recovery] = None  # (store-made teams: see pycoll.recovery)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mpi(cls, comm: Any, ctx: Optional[Context] = None, *, tls: Optional[Sequence[str]] = None,
                 roles: bool = True) -> Team:
        """A team over an mpi4py intracommunicator (``COMM_WORLD`` or any sub-communicator).

        The communicator is duplicated, so pycoll's messages never meet the caller's. Collective
        over ``comm``: every rank calls it. ``tls`` overrides ``PYCOLL_TLS`` for this team.

        With ``PYCOLL_NUM_SERVERS=K`` (``pycoll run --servers K``) and ``COMM_WORLD``, the last K
        ranks are summation servers: they run the server loop here and exit when the workers are
        done; the workers get a team of the workers only, whose ``push_pull`` uses the servers.
        """
        return bootstrap.from_mpi(cls, comm, ctx, tls=tls, roles=roles)

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
        return bootstrap.from_store(cls, store, rank, size, ctx, prefix=prefix, advertise=advertise, tls=tls)

    def split(self, color: Optional[int], key: int = 0) -> Optional[Team]:
        """Split into sub-teams by ``color`` ordered by ``key`` (then rank), as ``MPI_Comm_split``;
        ranks passing ``color=None`` get ``None``. Collective over the team."""
        return bootstrap.split(self, color, key)

    def alloc(self, shape: Union[int, Sequence[int]], dtype: Any = "float32") -> Any:
        """A new array that every rank of the team on its host maps (collective): see :mod:`pycoll.arrays`."""
        return arrays.alloc(self, shape, dtype)

    def close(self) -> None:
        """Release the team's transport and shared segment (after its last collective). Raises
        :class:`pycoll.MismatchError` where this rank's last gathers on the shared segment went on
        without their root and the root's call turns out to differ (they are checked here)."""
        bootstrap.close(self)

    # ------------------------------------------------------------------ after a failure
    def revoke(self, why: str = "") -> None:
        """Make every pending and later call on this team raise :class:`pycoll.RevokedError` on
        every rank (``MPIX_Comm_revoke``); ``why`` goes into their error. See :mod:`pycoll.recovery`."""
        recovery.revoke(self, why)

    @property
    def revoked(self) -> bool:
        """Whether this team was revoked (here or by a peer, as far as this rank has seen)."""
        return self.planner.is_revoked()

    def agree(self, flag: bool = True, *, timeout: Optional[float] = None) -> bool:
        """The AND of ``flag`` over the ranks still there, the same on every rank that returns,
        even if ranks fail meanwhile (``MPIX_Comm_agree``). Needs a store-made team."""
        return all(recovery.need_recovery(self, "agree").decide(bool(flag), timeout).values())

    def shrink(self, *, timeout: Optional[float] = None) -> Team:
        """A new team of the ranks still there, renumbered in rank order, with fresh transports
        and shared memory (``MPIX_Comm_shrink``). Needs a store-made team."""
        return recovery.need_recovery(self, "shrink").shrink(timeout)

    def __repr__(self) -> str:
        return f"<Team {self.name} rank {self.rank}/{self.size} over {self.transport.name}>"

    # ------------------------------------------------------------------ point to point
    @property
    def p2p(self) -> Channel:
        """Raw point to point on the team's transport, outside the engine: ``p2p.isend(wire, peer,
        tag)`` and ``p2p.irecv(wire, peer, tag)`` post byte views (:func:`pycoll.buffers.as_bytes`)
        and return transport requests (poll ``test()``); they match :meth:`isend`/:meth:`irecv` by tag."""
        return self.transport.channel(("p",))

    def probe(self, peer: int, tag: Hashable = 0) -> bool:
        """Whether a message from team rank ``peer`` with ``tag`` waits for its receive."""
        return self.transport.probe(self._peer(peer), ("p", tag))

    def isend(self, buf: Any, peer: int, tag: Hashable = 0, *, priority: int = 0,
              timeout: Optional[float] = None) -> Request:
        """Send ``buf`` to team rank ``peer`` as a task of the engine (``MPI_Isend``): the Request
        is done once the send completed locally (the buffer may be reused)."""
        if self.ctx.inside():
            return raw_inside_task(self, "isend", as_bytes(buf), self._peer(peer), tag)
        task = SendTask(self, buf, self._peer(peer), tag, name=f"send->{peer}@{self.rank}")
        return self.planner.submit(task, priority, timeout, None)

    def irecv(self, buf: Any, peer: Optional[int] = None, tag: Hashable = 0, *, priority: int = 0,
              timeout: Optional[float] = None) -> Request:
        """Receive into ``buf`` from team rank ``peer`` (``None``: from any rank; the request's
        ``task.source`` then names it) as a task of the engine (``MPI_Irecv``)."""
        if peer is not None and self.ctx.inside():
            return raw_inside_task(self, "irecv", as_bytes(buf, writable=True), self._peer(peer), tag)
        if peer is None:
            task: Task = AnySourceRecvTask(self, buf, tag, name=f"recv<-any@{self.rank}")
        else:
            task = RecvTask(self, buf, self._peer(peer), tag, name=f"recv<-{peer}@{self.rank}")
        return self.planner.submit(task, priority, timeout, None)

    def send(self, buf: Any, peer: int, tag: Hashable = 0, *, priority: int = 0,
             timeout: Optional[float] = None) -> Any:
        """Blocking send (``MPI_Send``): returns once ``buf`` may be reused. (Its result stands in for
        the Request ``send`` returned before 0.2, with a DeprecationWarning: see Finished.)"""
        return Finished(self.isend(buf, peer, tag, priority=priority, timeout=timeout), "send")

    def recv(self, buf: Any, peer: Optional[int] = None, tag: Hashable = 0, *, priority: int = 0,
             timeout: Optional[float] = None) -> Any:
        """Blocking receive (``MPI_Recv``) into ``buf`` from team rank ``peer`` (``None``: any rank;
        to learn which, use :meth:`irecv`). Its result is as :meth:`send`'s."""
        return Finished(self.irecv(buf, peer, tag, priority=priority, timeout=timeout), "recv")

    def _peer(self, peer: int) -> int:
        if not 0 <= peer < self.size:
            raise ValueError(f"{self.name}: peer {peer} is not a rank of a team of {self.size}")
        return peer

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
        return self.ps.servers

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
        return self.ps.push_pull(buf, recvbuf, name, priority, average, mode, timeout)

    # ------------------------------------------------------------------ hierarchy
    @property
    def hierarchical(self) -> bool:
        """Whether the team spans nodes and has node and rail sub-teams."""
        return self.levels.node is not None

    def node_team(self) -> Team:
        """The ranks of this rank's node (this team itself when it is on one node; a team of one
        when every node holds one of its ranks). Made with the team."""
        if self.levels.node is not None:
            return self.levels.node
        topo = self.topology
        if topo is None or topo.n_nodes == 1:
            return self
        return self.alone()

    def rail_team(self) -> Team:
        """The ranks whose index on their node equals this rank's, one per node that has that many
        (the leaders team for local index 0; the teams of split-rail allreduce)."""
        if self.levels.rail is not None:
            return self.levels.rail
        topo = self.topology
        if topo is not None and topo.n_nodes == self.size:
            return self  # one rank per node: every rank leads its node
        return self.alone()

    def leaders_team(self) -> Optional[Team]:
        """The lowest rank of every node, on those ranks; None on the others."""
        if self.topology is not None and self.topology.local_rank(self.rank) != 0:
            return None
        if self.topology is None and self.rank != 0:
            return None
        return self.rail_team()

    def alone(self) -> Team:
        """A team of this rank only (made when first needed)."""
        if self.levels.alone is None:
            self.levels.alone = Team(0, 1, SelfTransport(), self.ctx, name=f"{self.name}/self{self.rank}")
        return self.levels.alone

    # ------------------------------------------------------------------ collectives by name
    def call(self, coll: str, *args: Any, **kwargs: Any) -> Call:
        """The checked call of collective ``coll`` with these arguments (raises for bad input)."""
        return collective(coll).check(self.rank, self.size, *args, **kwargs)

    def next_sequence(self) -> int:
        """The sequence number of the next untagged collective (matched across ranks by order)."""
        return self.planner.next_sequence()

    def task(self, coll: str, *args: Any, tag: Optional[Hashable] = None, algorithm: Optional[str] = None,
             **kwargs: Any) -> Task:
        """Build collective ``coll`` of this team as a task to add to a schedule, without
        submitting it: the levels of a hierarchical algorithm are such tasks on sub-teams (UCC's
        hierarchical task). Arguments as for the method of that name (``team.task("reduce",
        sendbuf, recvbuf, op, root)``). It takes its message key now, so build untagged ones in
        the same order on every rank, and as such a task on every rank (it is never behind the
        agreement check of :mod:`pycoll.agreement`, which the same call posted directly may be).
        It takes no credit (see :meth:`Planner.task <pycoll.planner.Planner.task>`)."""
        return self.planner.task(self.call(coll, *args, **kwargs), tag, algorithm)

    def submit(self, coll: str, *args: Any, priority: int = 0, tag: Optional[Hashable] = None,
               algorithm: Optional[str] = None, timeout: Optional[float] = None, name: Optional[str] = None,
               credit: bool = True, **kwargs: Any) -> Request:
        """Start collective ``coll`` by name (``team.submit("allreduce", buf, None, op)`` is
        ``team.allreduce(buf, None, op)``): what the scheduling layer posts through.

        ``name`` labels the task in traces and errors (a gradient's name); ``credit=False`` makes
        a collective that takes no credit (the scheduler's "immediate" tensors, control
        messages), started by priority alone."""
        call = self.call(coll, *args, **kwargs)
        return self.planner.post_named(call, priority, tag, algorithm, timeout, name, credit)

    def run_program(self, program: Any, *args: Any, priority: int = 0,
                    timeout: Optional[float] = None) -> Request:
        """Run ``program`` (a :class:`pycoll.lower.Program` of this rank: ``pycoll lower`` prints
        them, ``pycoll.lower.loads`` reads them) on the buffers of ``args``, the arguments of its
        collective as for the method of that name (``team.run_program(prog, x, out, "sum")``).
        One task, keyed like an untagged collective: start programs in the same order on every
        rank. Raises ``ProgramError`` for a program of another rank, size or call shape."""
        from pycoll.lower.execute import run_program  # noqa: PLC0415 - lowering is optional at import

        return run_program(self, program, self.call(program.coll, *args), priority, timeout)

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
        return team_traffic(self, include_self, subteams)

    def reset_traffic(self) -> None:
        """Count traffic from zero again (this team's transport and its sub-teams')."""
        reset_traffic(self)


# ---------------------------------------------------------------------- methods from the table
# Each row gets two real methods with the collective's own parameters (made from source text, as
# dataclasses and namedtuple make theirs: no *args/**kwargs repacking on the hot path, a true
# signature for help() and IDEs). Keywords that are not parameters are the algorithm's options.
_START = """
def {name}(self, {params}*, priority=0, tag=None, algorithm=None, timeout=None, **options):
    entry = self.recent.get(({name!r}, {first}))
    if entry is not None and not ({same}algorithm == entry.algorithm and timeout == entry.timeout):
        entry = entry.other  # (the call before, with other arguments or keywords)
        if entry is not None and not ({same}algorithm == entry.algorithm and timeout == entry.timeout):
            entry = None
    if entry is not None and tag is None and not options:
        lane = entry.lane  # the same call as the last: its persistent form, run again at once ...
        if lane is not None:
            req = lane.run()
            if req is not None:
                return req
        req = entry.again(priority)  # ... or started by the engine
        if req is not None:
            return req
    call = check(self.rank, self.size, {args})
    if algorithm is not None and algorithm == "push_pull":
        return self.ps.allreduce(call, priority, tag, timeout)
    req = self.planner.post(call, priority, tag, algorithm, timeout, options)
    if tag is None and not options:
        recent = self.recent
        if recent.admits(({name!r}, {first}), ({tuple}), timeout, algorithm):
            recent.add(({name!r}, {first}), ({tuple}), ({dtypes}), persistent_of, self.planner, call, timeout,
                       algorithm, timeout=timeout, algorithm=algorithm)
    return req
"""
_INIT = """
def {name}_init(self, {params}*, priority=0, tag=None, algorithm=None, timeout=None, **options):
    call = check(self.rank, self.size, {args})
    return Persistent(self.planner, call, priority, tag, algorithm, timeout, options)
"""


def _methods(row: Collective) -> Dict[str, Callable[..., Any]]:
    """``team.<name>(...)`` (check, then post) and ``team.<name>_init(...)`` (check once, return a
    persistent collective) of one row."""
    namespace: Dict[str, Any] = {"check": row.check, "Persistent": Persistent, "persistent_of": persistent_of}
    params = []
    for p in row.signature().parameters.values():
        if p.default is inspect.Parameter.empty:
            params.append(f"{p.name}, ")
        else:
            namespace[f"_default_{p.name}"] = p.default
            params.append(f"{p.name}=_default_{p.name}, ")
    fields = {"name": row.name, "params": "".join(params), "args": ", ".join(row.params),
              "tuple": "".join(f"{p}, " for p in row.params),
              "first": f"id({row.params[0]})" if row.params else "0"}  # see persistent.repeat_key
    fields["same"], fields["dtypes"] = repeat_test(row.params)  # (the express lane's test)
    namespace["dtype_of"], namespace["values_of"] = buffer_dtype, sequence_values
    exec(_START.format(**fields) + _INIT.format(**fields), namespace)  # our own template, our own names
    start, init = namespace[row.name], namespace[f"{row.name}_init"]
    start.__doc__ = docstring(row)
    init.__doc__ = (f"A persistent {row.name}: built once, run by each ``start()``; the buffers may be "
                    "refilled between starts.")
    for fn in (start, init):
        fn.__qualname__ = f"Team.{fn.__name__}"
        fn.__module__ = __name__
    return {row.name: start, f"{row.name}_init": init}


for _row in TABLE:
    for _name, _method in _methods(_row).items():
        setattr(Team, _name, _method)
del _row, _name, _method


def local_teams(n: int, ctx: Optional[Context] = None) -> List[Team]:
    """``n`` ranks inside this process, exchanging messages through memory and all run by one
    engine: test algorithms at any size without starting processes."""
    return bootstrap.local_teams(Team, n, ctx)


__all__ = ["Levels", "Persistent", "ReduceOp", "Team", "local_teams"]
