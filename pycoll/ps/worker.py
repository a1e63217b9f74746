"""The worker's side of BytePS push-sum-pull on a team: ``team.push_pull(...)``.

A :class:`PushPull` belongs to one team of workers. It declares each tensor's layout to the
summation servers once, builds the push/sum/pull schedule of every call
(:mod:`pycoll.algorithms.push_pull`), runs the colocated asynchronous services in the background,
and says goodbye to the servers when the team closes (or at exit), so that they stop serving.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Hashable, List, Optional

import numpy as np

from pycoll import calls
from pycoll.algorithms import push_pull as pp
from pycoll.calls import Call
from pycoll.engine.progress_thread import progress_thread
from pycoll.engine.request import Request
from pycoll.ops import ReduceOp
from pycoll.ps.placement import plan
from pycoll.ps.server import CONTROL, control_message, goodbye
from pycoll.tasks.p2p import SendTask
from pycoll.tasks.task import Task

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.team import Team


class Forever(Task):
    """A task that stays in progress until completed from outside (keeps a progress thread
    driving background services)."""

    takes_credit = False
    polled = False

    def post(self) -> None:
        """Nothing to start: the task only holds the progress thread until completed."""


class PushPull:
    """Push-sum-pull for the workers of ``team``; ``roles`` says which world ranks are the
    summation servers (None: no servers, the workers' colocated services sum everything)."""

    def __init__(self, team: Team, roles: Optional[pp.Roles] = None) -> None:
        self.team = team
        self.roles = roles
        self._layouts: Dict[str, dict] = {}  # tensors seen: name -> layout
        self._async: Dict[str, Any] = {}  # async tensors: this worker's colocated services
        self._serving: Optional[Task] = None  # keeps the progress thread on while they serve

    @property
    def servers(self) -> List[int]:
        """World ranks of the summation servers (empty without)."""
        n = self.team.size
        return list(range(n, n + self.roles.k)) if self.roles is not None else []

    def push_pull(self, buf: Any, recvbuf: Any, name: str, priority: int, average: bool, mode: str,
                  timeout: Optional[float]) -> Request:
        """See :meth:`pycoll.Team.push_pull`."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"push_pull needs a non-empty tensor name, got {name!r}")
        if mode not in ("sync", "async"):
            raise ValueError(f"push_pull mode must be 'sync' or 'async', got {mode!r}")
        if mode == "async" and average:
            raise ValueError("push_pull: average applies to sync mode (async adds deltas)")
        team = self.team
        call = calls.allreduce(team.rank, team.size, buf, recvbuf, ReduceOp.AVG if average else ReduceOp.SUM)
        return self.run(call, name, priority, mode, timeout)

    def allreduce(self, call: Call, priority: int, tag: Optional[Hashable],
                  timeout: Optional[float]) -> Request:
        """A checked allreduce run as a push-sum-pull (``algorithm="push_pull"``), named after its
        tag (untagged: after the collective's sequence number)."""
        if call.coll != "allreduce":
            raise ValueError(f"unknown {call.coll} algorithm 'push_pull' (push_pull is an allreduce)")
        if call.op not in (ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(f"allreduce algorithm 'push_pull' sums (SUM or AVG), not {call.op.name}")
        name = f"allreduce:{tag!r}" if tag is not None else f"allreduce#{self.team.next_sequence()}"
        return self.run(call, name, priority, "sync", timeout)

    def run(self, call: Call, name: str, priority: int, mode: str, timeout: Optional[float]) -> Request:
        """Build and submit the push-sum-pull of a checked allreduce ``call`` of tensor ``name``."""
        team = self.team
        op = call.op
        src, dst = call.src.reshape(-1), call.dst.reshape(-1)
        pb = team.ctx.partition_bytes or (4 << 20)
        roles = self.roles if self.roles is not None else pp.Roles(team, team.size, 0)
        decl = dict(kind="decl", name=name, count=int(src.size), dtype=src.dtype.name,
                    partition_bytes=int(pb), op=op.name, mode=mode)
        known = self._layouts.get(name)
        if known is not None and known != decl:
            raise ValueError(f"push_pull: tensor {name!r} was {known['count']} x {known['dtype']} "
                             f"({known['op']}, partitions of {known['partition_bytes']} B), now "
                             f"{decl['count']} x {decl['dtype']} ({decl['op']}, "
                             f"{decl['partition_bytes']} B): a name keeps its layout; use another name")
        with team.ctx.lock:
            if mode == "async":
                service = self._async.get(name)
                if service is None:
                    service = self._async[name] = self._start_async_service(roles, name, src, pb)
                sched = pp.build_async(roles, team.rank, name, src, dst, service, pb, priority)
            else:
                sched = pp.build(roles, team.rank, name, src, dst, op, pb, priority)
            if known is None:
                self._layouts[name] = decl
                if roles.k and team.rank == 0:  # the servers learn the tensor with its first pushes
                    for s in range(roles.k):
                        sched.add(SendTask(roles.world, control_message(**decl), roles.n + s, CONTROL,
                                           name=f"declare {name}->server{s}"))
            return team.planner.submit(sched, priority, timeout, call.out)

    def _start_async_service(self, roles: pp.Roles, name: str, src: np.ndarray, pb: int) -> Any:
        """This worker's colocated async service of ``name``, served in the background (the
        context's progress thread drives it while the worker computes)."""
        team = self.team
        mine = [p for p in plan(name, src.size, src.itemsize, roles.n, roles.k, pb)
                if not p.service.server and p.service.index == team.rank]
        service = pp.AsyncService(roles, name, mine, src.dtype, team.rank)
        service.start()
        if self._serving is None:  # keep the progress thread driving until the team closes
            self._serving = Forever(name=f"{team.name}: async services")
            progress_thread(team.ctx).watch([team.ctx.submit(self._serving)], lambda error: None)
        return service

    def stop_async(self) -> None:
        """Serve the other workers until every worker got here, then stop serving."""
        if not self._async:
            return
        team = self.team
        team.barrier(timeout=None).wait()
        with team.ctx.lock:
            for service in self._async.values():
                service.stop()
            self._async.clear()
            if self._serving is not None:
                self._serving.complete()
                self._serving = None

    def close(self) -> None:
        """Stop the async services and tell the servers this worker is done (once); closes the
        world team of workers and servers."""
        self.stop_async()
        roles, self.roles = self.roles, None
        if roles is not None:
            if roles.k:
                goodbye(roles.world, roles.n, roles.k, self.team.rank)
            roles.world.close()

    def goodbye_at_exit(self) -> None:
        """At interpreter exit: the same as :meth:`close` but leaves the world team to the exit."""
        self.stop_async()
        roles, self.roles = self.roles, None
        if roles is not None and roles.k:
            goodbye(roles.world, roles.n, roles.k, self.team.rank)
