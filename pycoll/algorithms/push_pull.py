"""BytePS push-sum-pull as a schedule (sync mode).

A tensor is cut into parts (:mod:`pycoll.ps.placement`); each part is summed by one summation
service: a CPU-only server, or the colocated service that every worker hosts. On worker ``i``:

* a part summed elsewhere: **push** it to its service (a send, the unit of credit: it completes
  locally, so credit always comes back), then **pull** the sum (a receive);
* a part summed by worker ``i``'s own service: receive the other ``n-1`` workers' pushes, add
  all ``n`` contributions in worker order (the local one straight from the buffer: it never
  touches the network), divide for an average, send the sum back to the others.

A server runs the same service rounds (:func:`service_round`) with ``n`` remote contributions
(:mod:`pycoll.ps.server`). Sums are made in worker order everywhere, so every worker gets the same
bits. Messages are tagged by (tensor name, part), and one round of a tensor follows the other in
order on every pair of ranks.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from pycoll.events.manager import Event
from pycoll.ops import ReduceOp, finish_avg, reduce_into
from pycoll.ps.placement import Part, plan
from pycoll.tasks.p2p import RecvTask, SendTask
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import FunctionTask

#: Tags of push-pull messages (in the team's point-to-point space).
PUSH, PULL = "push", "pull"


def tag(name: str, key: int, what: str) -> tuple:
    return ("pycoll-pp", name, key, what)


class Roles:
    """Who is who in a push-pull: ``world`` is the team that holds workers and servers (world
    ranks ``0..n-1`` are the workers, ``n..n+k-1`` the servers)."""

    def __init__(self, world: Any, n: int, k: int) -> None:
        self.world, self.n, self.k = world, n, k

    def owner(self, part: Part) -> int:
        """World rank of the service that sums ``part``."""
        return self.n + part.service.index if part.service.server else part.service.index


def _sum(out: np.ndarray, contributions: List[np.ndarray], op: ReduceOp, n: int) -> None:
    """``out = c0 + c1 + ...`` in worker order (``out`` may be one of them)."""
    acc = contributions[0].copy()
    for c in contributions[1:]:
        reduce_into(acc, c, ReduceOp.SUM)
    if op is ReduceOp.AVG:
        finish_avg(acc, n)
    out[...] = acc


def service_round(roles: Roles, name: str, part: Part, out: np.ndarray, own: Optional[int],
                  own_data: Optional[np.ndarray], sched: Schedule, op: ReduceOp) -> None:
    """Add to ``sched`` one round of the service of ``part``: receive the pushes of every worker
    but ``own`` (whose contribution is ``own_data``), sum into ``out``, send ``out`` back to
    them."""
    world, n = roles.world, roles.n
    contributions: List[np.ndarray] = []
    recvs = []
    for w in range(n):
        if w == own:
            contributions.append(own_data)
            continue
        scratch = np.empty_like(out)
        contributions.append(scratch)
        recvs.append(sched.add(RecvTask(world, scratch, w, tag(name, part.key, PUSH),
                                        name=f"{name}/part{part.key}<-push{w}")))
    total = sched.add(FunctionTask(_sum, out, contributions, op, n, name=f"{name}/part{part.key}:sum",
                                   nbytes=out.nbytes), after=recvs or None)
    for w in range(n):
        if w != own:
            sched.add(SendTask(world, out, w, tag(name, part.key, PULL),
                               name=f"{name}/part{part.key}->pull{w}"), after=total)


def build(roles: Roles, me: int, name: str, src: np.ndarray, dst: np.ndarray, op: ReduceOp,
          partition_bytes: int, priority: int = 0) -> Schedule:
    """Worker ``me``'s push-pull of ``src`` (flat) into ``dst`` (flat, may be ``src``)."""
    sched = Schedule(name=f"push_pull:{name}@{me}", priority=priority)
    world = roles.world
    for part in plan(name, src.size, src.itemsize, roles.n, roles.k, partition_bytes):
        s, d = src[part.lo:part.hi], dst[part.lo:part.hi]
        if not part.service.server and part.service.index == me:
            service_round(roles, name, part, d, me, s, sched, op)
            continue
        owner = roles.owner(part)
        push = SendTask(world, s, owner, tag(name, part.key, PUSH), name=f"{name}/part{part.key}:push",
                        priority=priority)
        push.credit = s.nbytes  # the unit of credit: a send always completes, so it always comes back
        sched.add(push)
        pull = RecvTask(world, d, owner, tag(name, part.key, PULL), name=f"{name}/part{part.key}:pull")
        # in place, the pull may overwrite the pushed data only once the push is done with it
        sched.add(pull, after=push if np.shares_memory(s, d) else None)
    return sched


# ---------------------------------------------------------------------------------- async mode
class AsyncService:
    """The asynchronous summation service of some parts of one tensor (BytePS section 5): it keeps
    the latest parameters (starting at zero); each worker's push is a delta that is added at once,
    and the worker pulls the current values back, without waiting for the others.

    Every (part, worker) pair has its own chain (receive delta, add, copy out, send back), re-armed
    as soon as it finishes, so one worker's pushes never wait for another's."""

    def __init__(self, roles: Roles, name: str, parts: List[Part], dtype: Any, own: Optional[int]) -> None:
        self.roles, self.name, self.own = roles, name, own
        self.params = {p.key: np.zeros(p.hi - p.lo, dtype) for p in parts}
        self.parts = parts
        self.served = 0  # exchanges done
        self.error: Optional[BaseException] = None
        self._live: List[Any] = []
        self.stopped = False

    def start(self) -> None:
        for part in self.parts:
            for w in range(self.roles.n):
                if w != self.own:
                    self._arm(part, w)

    def _arm(self, part: Part, w: int) -> None:
        world, key = self.roles.world, part.key
        params = self.params[key]
        delta, reply = np.empty_like(params), np.empty_like(params)
        label = f"{self.name}/part{key}"
        chain = Schedule(name=f"{label}:async<->{w}")
        recv = chain.add(RecvTask(world, delta, w, tag(self.name, key, PUSH), name=f"{label}<-delta{w}"))
        add = chain.add(FunctionTask(_apply_delta, params, delta, reply, name=f"{label}:add"), after=recv)
        chain.add(SendTask(world, reply, w, tag(self.name, key, PULL), name=f"{label}->params{w}"), after=add)
        chain.subscribe(Event.COMPLETED, self, lambda svc, task, data: svc.done(task, part, w))
        self._live.append(chain)
        world.ctx.submit(chain)

    def done(self, chain: Any, part: Part, w: int) -> None:
        """One exchange with worker ``w`` finished: count it and re-arm the chain (unless stopped)."""
        self._live.remove(chain)
        self.served += 1
        if not self.stopped:
            self._arm(part, w)

    def local(self, part: Part, delta: np.ndarray, out: np.ndarray) -> None:
        """The own worker's exchange (no network): add its delta, read the parameters."""
        _apply_delta(self.params[part.key], delta, out)

    def stop(self) -> None:
        self.stopped = True
        for chain in list(self._live):
            chain.cancel()
        self._live.clear()


def _apply_delta(params: np.ndarray, delta: np.ndarray, reply: np.ndarray) -> None:
    reduce_into(params, delta, ReduceOp.SUM)
    reply[...] = params


def build_async(roles: Roles, me: int, name: str, src: np.ndarray, dst: np.ndarray, service: AsyncService,
                partition_bytes: int, priority: int = 0) -> Schedule:
    """Worker ``me``'s asynchronous push-pull: push the delta ``src``, pull the current parameters
    into ``dst``; its own service's parts are exchanged locally."""
    sched = Schedule(name=f"push_pull(async):{name}@{me}", priority=priority)
    world = roles.world
    for part in plan(name, src.size, src.itemsize, roles.n, roles.k, partition_bytes):
        s, d = src[part.lo:part.hi], dst[part.lo:part.hi]
        if not part.service.server and part.service.index == me:
            sched.add(FunctionTask(service.local, part, s, d, name=f"{name}/part{part.key}:local"))
            continue
        owner = roles.owner(part)
        push = SendTask(world, s, owner, tag(name, part.key, PUSH), name=f"{name}/part{part.key}:delta",
                        priority=priority)
        push.credit = s.nbytes
        sched.add(push)
        sched.add(RecvTask(world, d, owner, tag(name, part.key, PULL), name=f"{name}/part{part.key}:params"),
                  after=push if np.shares_memory(s, d) else None)
    return sched
