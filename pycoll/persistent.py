"""Persistent collectives (MPI-4's ``MPI_Allreduce_init`` and friends): built once, started often.

``team.<coll>_init(...)`` checks the arguments once and returns a :class:`Persistent`; every
``start()`` runs the collective again on the same buffers (refill them between starts), reusing the
task, its schedule and its scratch buffers when the algorithm allows (``rebind``). A start that
finds the engine idle takes its express lane: a segment collective, or a native program over UCX,
is then one native call.

A blocking or non-blocking call repeated with the same argument objects becomes one too
(:class:`Repeated`): the team remembers each collective's last call, and from the second in a row
the call is a start of a persistent collective made of it, with no checks, selection or building.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Hashable, List, Optional, Tuple, Union

import numpy as np

from pycoll.buffers import unowned
from pycoll.calls import Call
from pycoll.engine.express import ExpressLane, ProgramLane, has_express_lane
from pycoll.engine.request import Request
from pycoll.tasks.task import COMPLETED, FINISHED, Task, rebindable

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.planner import Planner


class Persistent:
    """A persistent collective: its schedule and scratch are built once; every ``start()`` runs
    it again on the same buffers and returns the Request of that run."""

    def __init__(self, planner: Planner, call: Call, priority: int, tag: Optional[Hashable],
                 algorithm: Optional[str], timeout: Optional[float], options: dict) -> None:
        self.planner = planner
        self.coll = call.coll
        self.call = call = own_views(call)
        self._tag, self._algorithm, self._options = tag, algorithm, options
        #: The priority of each run (may be changed between starts).
        self.priority = priority
        self._timeout = timeout
        #: The task kept between starts (None before the first start, or when the algorithm's
        #: tasks cannot be rebound and each start builds a new one).
        self.task: Optional[Task] = None
        #: The request of the current (or last) run.
        self.request: Optional[Request] = None
        #: The engine's express lane of its task (a segment collective or a native program, untagged),
        #: once built.
        self.lane: Optional[Union[ExpressLane, ProgramLane]] = None

    def start(self) -> Request:
        """Run the collective once more (collective: every rank starts it).

        The short paths: the task kept from the last run completed; the engine's express lane
        runs it again at once when it holds no other work and the last run's outcome was
        collected (a segment collective: one native call), else the planner rebinds it (a new
        message key, the same buffers) and submits it."""
        task = self.task
        if task is not None and task.state is COMPLETED:
            req = self.rerun()
            if req is None:
                raise RuntimeError(f"persistent {self.coll}: start() while the previous run is in progress")
            return req
        planner, call, tag, lock = self.planner, self.call, self._tag, self.planner.ctx.lock
        if self.request is not None and not self.request.done:
            raise RuntimeError(f"persistent {self.coll}: start() while the previous run is in progress")
        with lock:  # the first start, or the last run failed: build it (again)
            task, key, shape = planner.build(call, tag, self._algorithm, self._options, reuse=False)
            self.task = task if shape is not None and rebindable(task) else None
            if shape is not None:  # one collective (not partitioned): a unit of credit
                planner.credit_unit(task, key)
            self.lane = (planner.express_lane(task, call.out, self)
                         if tag is None and self.task is not None and has_express_lane(task) else None)
            run = planner.checked(task, call, key)  # (behind the agreement check when it is due one)
            self.request = planner.submit(run, self.priority, self._timeout, call.out)
            task.timeout = run.timeout  # (the express lane's runs wait as long: submit set the check's)
        return self.request

    def rerun(self) -> Optional[Request]:
        """Run the kept task again (the express lane, else restarted through the planner): the
        request of this run, or None when the task is not finished (another thread started it
        meanwhile: nothing was done)."""
        lane = self.lane
        if lane is not None:
            req = lane.run()  # (it sets self.request)
            if req is not None:
                return req
        task, planner = self.task, self.planner
        lock = planner.ctx.lock
        lock.acquire()  # (not ``with``: this is the hot path)
        try:
            if task is None or task.state is not COMPLETED:  # checked again under the lock
                return None
            self.request = planner.restart(task, self.call, self._tag, self.priority, self._timeout)
        finally:
            lock.release()
        return self.request

    def restart_as(self, key: tuple) -> Request:
        """Run the kept task again through the planner under ``key``, a number its express lane
        took for a run that is due the agreement check (under the engine's lock)."""
        planner, task = self.planner, self.task
        self.request = planner.restart(task, self.call, self._tag, self.priority, self._timeout, key)
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
        """Release the schedule, its scratch and the buffers (MPI_Request_free): an exporter that
        counts its views (DLPack) sees them go at once, not at the next garbage collection."""
        if self.task is not None:
            self.task.finalize()
            self.task = None
        self.lane = None

    def __del__(self) -> None:
        # dropped without free() (as Python code drops objects): release the schedule's scratch
        # now; a schedule is a reference cycle that the garbage collector frees only much later
        task = self.task
        if task is not None and task.state in FINISHED:  # (a run in flight or queued still needs it)
            task.finalize()


def own_views(call: Call) -> Call:
    """``call`` with flat views of its arrays of its own (the same memory): the caller's 1-D
    arrays are the call's arrays themselves (no view is made on the hot path), and a persistent
    collective must not see the caller reshape them later (``a.shape = (1, 8)``, which leaves its
    flags as they were)."""
    src, dst = call.src, call.dst
    vsrc = _flat_view(src)
    vdst = vsrc if dst is src else _flat_view(dst)
    return call._replace(src=vsrc, dst=vdst)


def _flat_view(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.shape = (view.size,)  # (the array is contiguous: a flat view, never a copy)
    return view


_ref = weakref.ref

#: The parameters of the collectives that are buffers (a repeated call compares their dtypes).
BUFFER_PARAMS = frozenset(("buf", "sendbuf", "recvbuf"))

#: The parameters of the v-collectives that are sequences of counts or displacements: a repeated
#: call compares their values too (a list may be changed in place between calls).
COUNT_PARAMS = frozenset(("counts", "displs", "sendcounts", "recvcounts", "sdispls", "rdispls"))

#: What :func:`buffer_dtype` gives for a buffer a repeated call cannot be recognised by.
UNSTABLE = object()


def buffer_dtype(buf: Any) -> Any:
    """What a repeated call is recognised by besides a buffer argument's identity: an ndarray's
    dtype (it may be reassigned in place), None for None, :data:`UNSTABLE` for any other object
    (which may change size or place between calls: such calls are never taken as repeats)."""
    if buf is None:
        return None
    return buf.dtype if type(buf) is np.ndarray else UNSTABLE


def sequence_values(seq: Any) -> Any:
    """What a repeated call is recognised by besides a counts or displacements argument's
    identity: its values (None for None)."""
    return None if seq is None else tuple(seq)


def repeat_test(params: List[str]) -> Tuple[str, str]:
    """``(same, dtypes)``: source text for a collective method with parameters ``params`` (see
    :mod:`pycoll.team`). ``same``, a conjunction ending in ``and``: the call's arguments are the
    remembered call's (``entry``) objects, its ndarray buffers of the same dtypes and flags (both
    reassignable in place: ``setflags(write=False)``, strides set so that an array is no longer
    contiguous) and its counts and displacements of the same values (a list may be changed in place);
    ``dtypes``: the tuple items ``entry.dtypes`` is made of (``dtype_of``, ``values_of``: this
    module's :func:`buffer_dtype` and :func:`sequence_values`)."""
    same = "".join(f"entry.args[{i}] is {p} and " for i, p in enumerate(params))
    same += "".join(f"({p} is None or ({p}.dtype is entry.dtypes[{i}] and "
                    f"{p}.flags.num == entry.flags[{i}])) and "
                    for i, p in enumerate(params) if p in BUFFER_PARAMS)
    same += "".join(f"({p} is None or tuple({p}) == entry.dtypes[{i}]) and "
                    for i, p in enumerate(params) if p in COUNT_PARAMS)
    dtypes = "".join(f"dtype_of({p}), " if p in BUFFER_PARAMS else
                     f"values_of({p}), " if p in COUNT_PARAMS else "None, " for p in params)
    return same, dtypes


class Repeated:
    """A call remembered by a team (or :class:`pycoll.mpi.Comm`): its argument objects (compared
    by identity) and the dtypes of its ndarray buffers. From the second call in a row with the
    same arguments (no pycoll keywords but the same timeout and algorithm), the call runs as a
    :class:`Persistent` made of it (``make(*made_of)``): one start, the engine's express lane when
    it is idle."""

    __slots__ = ("args", "dtypes", "flags", "timeout", "algorithm", "make", "made_of", "persistent", "lane",
                 "nbytes", "other", "pinned")

    def __init__(self, args: tuple, dtypes: tuple, make: Callable[..., Persistent], made_of: tuple,
                 timeout: Optional[float] = None, algorithm: Optional[str] = None) -> None:
        self.args = args
        #: Weak references to its ndarray arguments: numpy refuses to reallocate an array that has
        #: one, even with ``resize(refcheck=False)``, so a remembered array keeps the memory its
        #: persistent form points into (the repeat test compares objects, not addresses).
        self.pinned: List[Any] = []
        #: Each ndarray argument's flags (``flags.num``: contiguity, writeable), as the repeat test
        #: compares them; None for the others.
        self.flags: List[Optional[int]] = []
        for a in args:  # (one pass: this runs for every call posted as a new one)
            if type(a) is np.ndarray:
                self.flags.append(a.flags.num)
                while type(a) is np.ndarray:  # (a view's base too: resizing it would move the view)
                    self.pinned.append(_ref(a))
                    a = a.base
            else:
                self.flags.append(None)
        self.dtypes = dtypes
        self.timeout = timeout  # the call's timeout keyword (a repeat gives the same)
        self.algorithm = algorithm  # the call's algorithm keyword (a repeat names the same)
        self.make = make
        self.made_of = made_of
        self.persistent: Optional[Persistent] = None
        self.nbytes = 0  # what its buffers hold (see RecentCalls)
        #: The call remembered before this one under the same key, with other arguments (a program
        #: that alternates two output arrays repeats both): the caller looks there second.
        self.other: Optional[Repeated] = None
        #: The express lane of its persistent form, once made: a caller that finds the same
        #: arguments runs ``lane.run()`` first (the hot path), and :meth:`again` when it is closed.
        self.lane: Optional[Union[ExpressLane, ProgramLane]] = None

    def again(self, priority: int = 0) -> Optional[Request]:
        """Run the call again (the caller found the same arguments, and :attr:`lane` closed or
        not made yet) with ``priority``: the request of this run, or None when it must be posted
        as a new call (the persistent run before is still in flight or not collected, or the
        collective cannot be rerun without being built again)."""
        p = self.persistent
        if p is None:
            p = self.persistent = self.make(*self.made_of)
            p.priority = priority
            req = p.start()  # built now: the first run
            self.lane = p.lane
            return req
        task = p.task
        if task is None or task.state is not COMPLETED or not p.request.collected:
            return None  # (still in flight, failed or not collected: post the call as a new one)
        p.priority = priority
        return p.rerun()

    def free(self) -> None:
        """Release the persistent collective (the entry is replaced or forgotten, or the team
        closes); one still running or queued is only let go (its request finishes it)."""
        p, self.persistent = self.persistent, None
        self.lane = None
        if p is not None and (p.task is None or p.task.state in FINISHED):
            p.free()


def persistent_of(planner: Planner, call: Call, timeout: Optional[float],
                  algorithm: Optional[str] = None) -> Persistent:
    """A persistent collective of a checked call with no pycoll keywords but its timeout and
    algorithm (what a team's repeated call becomes)."""
    return Persistent(planner, call, 0, None, algorithm, timeout, {})


#: First arguments remembered per team (or Comm), each with its last two calls.
MAX_REPEATED = 64
#: When as many are remembered, one new call in this many takes the place of the oldest: a loop
#: over more buffers than that gains nothing from remembering them, and pays for it rarely.
ADMIT_EVERY = 16
#: The memory the remembered calls' buffers may hold (a remembered call keeps its buffers alive:
#: a program that drops a large array must get its memory back). The oldest make room; a call
#: whose buffers alone hold more is not remembered (repeating it saves nothing measurable).
MAX_REPEATED_BYTES = 8 << 20


def held_bytes(args: tuple) -> int:
    """The memory ``args``' buffers keep alive: each array's whole base (a view keeps all of it)."""
    total = 0
    for a in args:
        if isinstance(a, tuple) and a:  # (an mpi4py specification: pycoll.mpispec.Spec)
            a = a[0]
        if isinstance(a, np.ndarray) and unowned(a):
            continue  # (a view of memory it keeps no hold of)
        while isinstance(getattr(a, "base", None), np.ndarray):
            a = a.base
        nbytes = getattr(a, "nbytes", 0)
        total += nbytes if type(nbytes) is int else 0
    return total


def _same_objects(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _same_call(entry: Repeated, args: tuple, timeout: Optional[float], algorithm: Optional[str]) -> bool:
    """Whether ``entry`` is this call: the same objects, keywords, and ndarrays of the same dtypes
    and flags (one whose dtype or flags changed in place is remembered again, as it is now)."""
    if not (_same_objects(entry.args, args) and entry.timeout == timeout and entry.algorithm == algorithm):
        return False
    for a, f, d in zip(args, entry.flags, entry.dtypes):
        if f is not None and (a.flags.num != f or (isinstance(d, np.dtype) and a.dtype is not d)):
            return False
    return True


def repeat_key(name: str, args: tuple) -> tuple:
    """Where a call is remembered: its collective (or method) and the identity of its first
    argument, so that calls on different buffers (a model's gradients) are remembered side by side."""
    return (name, id(args[0]) if args else 0)


class RecentCalls(Dict[tuple, Repeated]):
    """The calls a team (or Comm) remembers, by :func:`repeat_key` (a dict: the hot path looks
    calls up with ``get``), the last two with different arguments under each key (the entry and
    its :attr:`Repeated.other`). A call posted as a new one asks :meth:`admits` first and, if
    admitted, is kept by :meth:`add` (the caller computes its dtypes only then)."""

    def __init__(self) -> None:
        super().__init__()
        self.turned_away = 0  # new calls not remembered because the table was full
        self.nbytes = 0  # what the remembered calls' buffers hold (MAX_REPEATED_BYTES)

    def admits(self, key: tuple, args: tuple, timeout: Optional[float] = None,
               algorithm: Optional[str] = None) -> bool:
        """Whether to remember a call with ``args`` (and these ``timeout`` and ``algorithm``
        keywords) just posted as a new one: not when it is one of the calls remembered there
        already (its persistent run was busy), nor, when the table is full, unless it is the
        :data:`ADMIT_EVERY`-th such call (it then takes the oldest's place). The same buffers
        with another algorithm or timeout are another call (a benchmark of one algorithm after
        another on the same arrays): it is remembered in place of the last."""
        entry = self.get(key)
        if entry is not None:
            other = entry.other
            return not (_same_call(entry, args, timeout, algorithm) or
                        (other is not None and _same_call(other, args, timeout, algorithm)))
        if len(self) < MAX_REPEATED:
            return True
        self.turned_away += 1
        if self.turned_away % ADMIT_EVERY:
            return False
        self.forget(next(iter(self)))
        return True

    def clear(self) -> None:
        """Forget every call (the team closes) and release their persistent collectives."""
        for entry in self.values():
            if entry.other is not None:
                entry.other.free()
            entry.free()
        super().clear()
        self.nbytes = 0

    def forget(self, key: tuple) -> None:
        """Forget the calls remembered at ``key`` and release their persistent collectives."""
        entry = self.pop(key)
        if entry.other is not None:
            self.nbytes -= entry.other.nbytes
            entry.other.free()
        self.nbytes -= entry.nbytes
        entry.free()

    def add(self, key: tuple, args: tuple, dtypes: tuple, make: Callable[..., Persistent],
            *made_of: Any, timeout: Optional[float] = None, algorithm: Optional[str] = None) -> None:
        """Remember a call (after :meth:`admits`): ``dtypes`` are :func:`buffer_dtype` of each
        buffer argument and None for the others (a call with an :data:`UNSTABLE` one is not kept);
        ``make(*made_of)`` makes its persistent form when it repeats; ``timeout``: the call's
        timeout keyword and ``algorithm`` its algorithm keyword (a repeat gives the same). The call
        remembered at ``key`` before becomes its :attr:`~Repeated.other`; the one before that goes."""
        for d in dtypes:
            if d is UNSTABLE:  # (not ``in``: a dtype compared with another object is slow to say no)
                return
        nbytes = held_bytes(args)
        if nbytes > MAX_REPEATED_BYTES:
            return
        last = self.pop(key, None)  # (and the key moves to the end: the oldest are forgotten first)
        if last is not None and last.other is not None:  # (first: its room is the new call's)
            self.nbytes -= last.other.nbytes
            last.other.free()
            last.other = None
        while self and self.nbytes + nbytes > MAX_REPEATED_BYTES:  # (the oldest keys: not this one)
            self.forget(next(iter(self)))
        if last is not None and self.nbytes + nbytes > MAX_REPEATED_BYTES:
            self.nbytes -= last.nbytes  # (no room for both: the new call alone)
            last.free()
            last = None
        entry = self[key] = Repeated(args, dtypes, make, made_of, timeout, algorithm)
        entry.other = last
        entry.nbytes = nbytes
        self.nbytes += nbytes
