"""Persistent collectives (MPI-4's ``MPI_Allreduce_init`` and friends): built once, started often.

``team.<coll>_init(...)`` checks the arguments once and returns a :class:`Persistent`; every
``start()`` runs the collective again on the same buffers (refill them between starts), reusing the
task, its schedule and its scratch buffers when the algorithm allows (``rebind``). A start that
finds the engine idle takes its express lane: a segment collective is then one native call.

A blocking or non-blocking call repeated with the same argument objects becomes one too
(:class:`Repeated`): the team remembers each collective's last call, and from the second in a row
the call is a start of a persistent collective made of it, with no checks, selection or building.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Optional

import numpy as np

from pycoll.calls import Call
from pycoll.engine.request import Request
from pycoll.planner import Planner
from pycoll.tasks.task import COMPLETED, Task


class Persistent:
    """A persistent collective: its schedule and scratch are built once; every ``start()`` runs
    it again on the same buffers and returns the Request of that run."""

    def __init__(self, planner: Planner, call: Call, priority: int, tag: Optional[Hashable],
                 algorithm: Optional[str], timeout: Optional[float], options: dict) -> None:
        self.planner = planner
        self.coll = call.coll
        self.call = call
        self._tag, self._algorithm, self._options = tag, algorithm, options
        #: The priority of each run (may be changed between starts).
        self.priority = priority
        self._timeout = timeout
        #: The task kept between starts (None before the first start, or when the algorithm's
        #: tasks cannot be rebound and each start builds a new one).
        self.task: Optional[Task] = None
        #: The request of the current (or last) run.
        self.request: Optional[Request] = None
        #: The finished request returned for every run that finished at once (the express lane).
        self.done: Optional[Request] = None
        #: Whether its task runs in the engine's express lane (known once built).
        self.express = False

    def start(self) -> Request:
        """Run the collective once more (collective: every rank starts it).

        The short paths: the task kept from the last run completed; the engine's express lane
        runs it again at once when it holds no other work (a segment collective: one native
        call), else the planner rebinds it (a new message key, the same buffers) and submits it."""
        task = self.task
        if task is not None and task.state is COMPLETED:
            if self.express:
                req = self.planner.express(task, self)
                if req is not None:
                    return req
            planner, call, tag = self.planner, self.call, self._tag
            lock = planner.ctx.lock
            lock.acquire()  # (not ``with``: this is the hot path)
            try:
                self.request = planner.restart(task, call, tag, self.priority, self._timeout)
            finally:
                lock.release()
            return self.request
        planner, call, tag, lock = self.planner, self.call, self._tag, self.planner.ctx.lock
        if self.request is not None and not self.request.done:
            raise RuntimeError(f"persistent {self.coll}: start() while the previous run is in progress")
        with lock:  # the first start, or the last run failed: build it (again)
            task, key, shape = planner.build(call, tag, self._algorithm, self._options, reuse=False)
            self.task = task if shape is not None and hasattr(task, "rebind") else None
            self.express = tag is None and getattr(self.task, "express", None) is not None
            if shape is not None:  # one collective (not partitioned): a unit of credit
                planner.credit_unit(task, key)
            self.request = planner.submit(task, self.priority, self._timeout, call.out)
        return self.request

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Wait for the current run."""
        if self.request is None:
            raise RuntimeError(f"persistent {self.coll}: wait() before start()")
        return self.request.wait(timeout)

    def test(self) -> bool:
        """Whether the current run finished."""
        return self.request is not None and self.request.test()

    def free(self) -> None:
        """Release the schedule and its scratch (MPI_Request_free)."""
        if self.task is not None:
            self.task.finalize()
            self.task = None


#: The parameters of the collectives that are buffers (a repeated call compares their dtypes).
BUFFER_PARAMS = frozenset(("buf", "sendbuf", "recvbuf"))

#: What :func:`buffer_dtype` gives for a buffer a repeated call cannot be recognised by.
UNSTABLE = object()


def buffer_dtype(buf: Any) -> Any:
    """What a repeated call is recognised by besides a buffer argument's identity: an ndarray's
    dtype (it may be reassigned in place), None for None, :data:`UNSTABLE` for any other object
    (which may change size or place between calls: such calls are never taken as repeats)."""
    if buf is None:
        return None
    return buf.dtype if type(buf) is np.ndarray else UNSTABLE


class Repeated:
    """The last call of one collective on a team: its argument objects (compared by identity) and
    the dtypes of its ndarray buffers. From the second call in a row with the same arguments (and
    no pycoll keywords), the call runs as a :class:`Persistent` made of it (``make()``): one
    start, the engine's express lane when it is idle.

    Kept by the team's planner (``planner.recent``) by collective name, and by
    :class:`pycoll.mpi.Comm` for mpi4py's arguments."""

    __slots__ = ("args", "dtypes", "make", "persistent")

    def __init__(self, args: tuple, dtypes: tuple, make: Callable[[], Persistent]) -> None:
        self.args = args
        self.dtypes = dtypes
        self.make = make
        self.persistent: Optional[Persistent] = None

    def again(self, priority: int = 0) -> Optional[Request]:
        """Run the call again (the caller found the same arguments) with ``priority``: the request
        of this run, or None when it must be posted as a new call (the persistent run before is
        still in flight or not collected, or the collective cannot be rerun without being built
        again)."""
        p = self.persistent
        if p is None:
            p = self.persistent = self.make()
            p.priority = priority
            return p.start()  # built now: the first run
        task = p.task
        if task is None or task.state is not COMPLETED or not (p.request is p.done or p.request.collected):
            return None
        if p.express:  # (Persistent.start's first step, inlined: this is the hot path)
            req = p.planner.express(task, p)  # (the engine is idle: priority orders nothing)
            if req is not None:
                return req
        p.priority = priority
        return p.start()

    def free(self) -> None:
        """Release the persistent collective (the entry is replaced or the team closes)."""
        if self.persistent is not None:
            self.persistent.free()
            self.persistent = None


#: Calls remembered per team (or Comm); the oldest is forgotten first.
MAX_REPEATED = 64


def repeat_key(name: str, args: tuple) -> tuple:
    """Where a call is remembered: its collective (or method) and the identity of its first
    argument, so that calls on different buffers (a model's gradients) are remembered side by side."""
    return (name, id(args[0]) if args else 0)


def remember(recent: Dict[tuple, Repeated], key: tuple, args: tuple, dtypes: tuple,
             make: Callable[[], Persistent]) -> None:
    """A call with ``args`` (``dtypes``: :func:`buffer_dtype` of each buffer argument, None for
    the others), remembered under ``key`` (:func:`repeat_key`), was posted as a new call: keep it
    as the last call there, unless it is that already."""
    entry = recent.get(key)
    if entry is not None:
        if (len(entry.args) == len(args) and all(a is b for a, b in zip(entry.args, args))
                and entry.dtypes == dtypes):
            return  # the same call, posted anew while its persistent run was busy
        entry.free()
        del recent[key]
    if UNSTABLE in dtypes:
        return
    if len(recent) >= MAX_REPEATED:
        recent.pop(next(iter(recent))).free()
    recent[key] = Repeated(args, dtypes, make)
