"""The progress engine: one :class:`Context` per process runs every schedule.

Read :meth:`Context.progress` top to bottom; it is the whole engine:

1. poll the transports (they complete receives and sends);
2. progress the tasks in flight that are polled;
3. fail tasks whose deadline passed;
4. start ready tasks in priority order (lower number first, FIFO within a priority) while the
   credit allows: a task that takes credit holds ``nbytes`` from post to completion, and the head
   of the queue waits while it does not fit (unless nothing is in flight). Tasks larger than the
   partition size that can be split start as fragments inheriting their priority.

The engine-task contract, engine side: tasks call :meth:`Context.enqueue` (a task's dependencies
are done) and :meth:`Context.release_credit` (a task that held credit finished); code that gives the
engine more credit calls :meth:`Context.start_ready`. Of a task, the engine writes its ``state``
when it starts it, its ``priority`` when ``submit`` is given one, and the fields documented as *owned
by the engine* in :class:`~pycoll.tasks.task.Task` (``effective_priority``, ``pending``, ``ctx``,
``held_credit``, ``parts``, ``t_ready``, ``t_start``); nothing else. Of a transport it uses
``progress()`` and, to start credit-blocked work that a peer already started, ``demand_id``,
``watch_arrivals``/``unwatch_arrivals``, ``take_arrivals``, ``poll_unexpected`` and
``has_unexpected_id`` (see :class:`~pycoll.tl.base.Transport`).

:meth:`Context.wait_for` drives ``progress`` until a task finishes, backing off when nothing moves
(spin, then ``sched_yield``, then sleeps growing to 1 ms) so a waiting rank leaves the core to the
others. When the one task in flight can sleep until its peer acts (a segment collective: a futex
on the flag it waits for, set and woken by the peer), the back-off sleeps that way instead.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Dict, Hashable, Iterator, List, Optional, Tuple, Union

from pycoll import config
from pycoll import trace as _trace
from pycoll.engine.express import ExpressLane, ProgramLane
from pycoll.engine.ready import ReadyQueue
from pycoll.engine.request import Request
from pycoll.errors import TimeoutError
from pycoll.events.manager import Event
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import CANCELED, COMPLETED, ERROR, FINISHED, IN_PROGRESS, NOT_READY, Task

log = logging.getLogger("pycoll")
#: How often a waiting engine runs its watches (:meth:`Context.watch`), in seconds.
WATCH_S = 0.05

_STARTED = Event.STARTED
_monotonic = time.monotonic
_heappush = heapq.heappush
_heappop = heapq.heappop


def _never(number: int) -> bool:
    """No run of an express lane is due the agreement check."""
    return False


def _parts_completed(task: Task, parts: Task, data: Any) -> None:
    if task.state is IN_PROGRESS:
        task.complete()


def _parts_failed(task: Task, parts: Task, data: Any) -> None:
    if task.state is IN_PROGRESS:
        if parts.error is not None:
            task.fail(parts.error)
        else:
            task.cancel()


class Backoff:
    """Idle back-off for a waiting rank: spin ``spin_s``, then yield until ``yield_s``, then sleep
    with the sleep doubling from ``sleep_min_s`` to ``sleep_max_s``. ``reset()`` when work moved.
    Where the rank can sleep until the one thing it waits for happens (``nap``), it does so from
    ``nap_s`` on (default: right after the spin) instead of yielding or sleeping."""

    __slots__ = ("spin_s", "yield_s", "sleep_min_s", "sleep_max_s", "nap_s", "_idle_since", "_sleep")

    def __init__(self, spin_s: float = 20e-6, yield_s: float = 2e-3, sleep_min_s: float = 20e-6,
                 sleep_max_s: float = 1e-3, nap_s: Optional[float] = None) -> None:
        self.spin_s = spin_s
        self.yield_s = yield_s
        self.sleep_min_s = sleep_min_s
        self.sleep_max_s = sleep_max_s
        self.nap_s = spin_s if nap_s is None else nap_s
        self._idle_since = 0.0
        self._sleep = sleep_min_s

    def reset(self) -> None:
        self._idle_since = 0.0
        self._sleep = self.sleep_min_s

    def idle(self, nap: Optional[Callable[[float], bool]] = None) -> None:
        """Called after a progress pass that moved nothing. ``nap(timeout_s)``: a way to sleep
        until the one thing the rank waits for happens (a segment collective's flag: see
        ``ShmSegment.sleep``); from ``nap_s`` on it replaces yielding and sleeping, so the rank
        gives its core away and is woken by the peer instead of polling for it."""
        now = _monotonic()
        if not self._idle_since:
            self._idle_since = now
            return
        idle = now - self._idle_since
        if idle < self.spin_s:
            return
        if nap is not None and idle >= self.nap_s:
            nap(self._sleep)
            self._sleep = min(self._sleep * 2, self.sleep_max_s)
            return
        if idle < self.yield_s:
            os.sched_yield()
            return
        time.sleep(self._sleep)
        self._sleep = min(self._sleep * 2, self.sleep_max_s)


class Context:
    """A progress engine: a priority queue of ready tasks, a credit gate and the tasks in flight.

    Args:
        credit_bytes: most bytes in flight (0: no limit); default ``PYCOLL_CREDIT_BYTES``.
        partition_bytes: split tasks larger than this (0: never); default ``PYCOLL_PARTITION_BYTES``.
        timeout: default timeout in seconds for collectives; default ``PYCOLL_TIMEOUT``.
    """

    def __init__(self, *, credit_bytes: Optional[int] = None, partition_bytes: Optional[int] = None,
                 timeout: Optional[float] = None) -> None:
        self.credit_bytes = config.get("PYCOLL_CREDIT_BYTES") if credit_bytes is None else int(credit_bytes)
        self.partition_bytes = (config.get("PYCOLL_PARTITION_BYTES") if partition_bytes is None
                                else int(partition_bytes))
        self.timeout = config.get("PYCOLL_TIMEOUT") if timeout is None else float(timeout or math.inf)
        self.in_flight = 0  # bytes of credit held by tasks in progress
        # Ready tasks by priority (FIFO within one): those that take credit, and those that do not
        # (schedules, local work), which never wait behind a task the credit holds back.
        # (these containers and ``_active``/``_demand_of`` are never rebound: express lanes hold them)
        self._ready = ReadyQueue()  # tasks that take credit
        self._free = ReadyQueue()  # tasks that take none
        self._active: List[Task] = []  # polled tasks in progress
        self._deadlines: list = []  # heap of (deadline, seq, task)
        self._transports: List[Any] = []
        # Tasks that take credit and carry a message key: if a peer already started one (a message
        # with its key arrived), it starts at once whatever the credit, so ranks that started
        # collectives in different orders never wait on each other. Indexed by (transport, demand
        # id); the transports list the ids of messages that arrive unexpected, so finding the
        # collectives peers started costs O(arrivals), not O(blocked collectives).
        self._demand: Dict[Tuple[Any, Hashable], List[Task]] = {}
        self._demand_of: Dict[Task, Tuple[Any, Hashable]] = {}
        self._demand_check: List[Task] = []  # watched since the last look: check each once
        self._demand_tls: Dict[int, list] = {}  # [transport, tasks watched on it]
        self._progress_hooks: List[Callable[[], int]] = []
        self._watches: List[Callable[[], Optional[bool]]] = []  # looked at while the engine waits idle
        self._next_watch = 0.0
        self.lock = threading.RLock()
        self.posted = 0  # tasks started
        #: Back-off of a waiting rank: (spin_s, yield_s, sleep_min_s, sleep_max_s, nap_s); see Backoff.
        spin_s = config.get("PYCOLL_SPIN_US") * 1e-6
        self.backoff: tuple = (spin_s, max(2e-3, spin_s), 20e-6, 1e-3, None)
        self.stats = {"partitioned": 0, "credit_waits": 0, "demand_starts": 0, "stall_starts": 0}
        #: Seconds the engine may stand still while work waits for credit before it starts the
        #: most urgent waiting task anyway (see ``_start_stalled``).
        self.stall_s = 0.2
        self._still_since = 0.0
        #: Called with each task the engine starts, before it publishes STARTED and posts it; set
        #: by tracing (which reads and consumes the task's ``t_ready``).
        self.on_start: Optional[Callable[[Task], None]] = None
        _trace.attach(self)  # PYCOLL_TRACE: every context traces its tasks (else nothing)

    # ----------------------------------------------------------------------------- submission
    def submit(self, task: Task, priority: Optional[int] = None, result: Any = None,
               on_done: Optional[Callable[[Request], None]] = None) -> Request:
        """Start ``task`` (as soon as its dependencies, priority and credit allow) and return a
        :class:`Request` for it (whose ``wait()`` returns ``result``, else the task's result;
        ``on_done(request)`` runs once when the request has seen the task finish)."""
        if task.state is not NOT_READY:
            raise RuntimeError(f"{task!r} was already submitted; reset() it to run it again")
        if priority is not None:
            task.priority = priority
        prio = task.priority
        task.effective_priority = prio if prio is not None else 0
        lock = self.lock
        lock.acquire()  # (not ``with``: this is the hot path of every collective)
        try:
            limit, in_flight, need = self.credit_bytes, self.in_flight, task.credit
            if self._ready or self._free or task.pending != 1 or (
                    limit and in_flight and in_flight + need > limit):
                task.activate(self)  # queued behind other work, waiting for dependencies or credit
                self.start_ready()
            elif (self.on_start is None and not self._demand_of
                    and not task.listened >> _STARTED & 1
                    and not (self.partition_bytes and task.nbytes > self.partition_bytes)):
                # The short path: nothing queued ahead of it, the credit fits, nobody traces, no
                # one listens to its start and it is not split: start it here and now.
                task.ctx = self
                task.pending = 0
                task.state = IN_PROGRESS
                self.posted += 1
                self._post(task, need)
                if self._ready or self._free:  # what it queued (a schedule's tasks)
                    self.start_ready()
            else:
                task.ctx = self  # nothing queued ahead of it and the credit fits: start it now
                task.pending = 0
                self._start(task, need)
                if self._ready or self._free:
                    self.start_ready()
            # made under the lock: a request for a finished task runs ``on_done`` at once
            return Request(task, self, result, on_done)
        finally:
            lock.release()

    def express_lane(self, task: Task, sequence: Iterator[int], result: Any, owner: Any,
                     due: Optional[Callable[[int], bool]] = None,
                     poster: Optional[List[int]] = None) -> Union[ExpressLane, ProgramLane]:
        """The express lane of ``task``, a segment collective called again on the same buffers
        (persistent, or repeated): see :class:`ExpressLane`. It is open only while this engine
        holds no other work: nothing queued, polled or watched for credit (the lane is given the
        engine's own containers of that work, which are never rebound, and finds them empty),
        nobody tracing; ``sequence`` is the team's counter of untagged collectives (a run takes a
        number from it as any collective does); ``owner.request`` is set to each run's request. A
        native program's task (``express_run``) gets a :class:`ProgramLane`: ``due(number)`` says
        whether that run is due the agreement check (then ``owner.restart_as(key)`` runs it).
        ``poster``: ``[ident]`` of the thread that posts the team's untagged collectives; a lane is
        closed to any other (the planner decides whether it may post)."""
        work = (self._ready, self._free, self._active, self._demand_of)
        poster = poster if poster is not None else [threading.get_ident()]
        if hasattr(task, "express_run"):
            return ProgramLane(self, work, task, sequence, result, owner, due or _never, poster)
        return ExpressLane(self, work, task, sequence, result, owner, poster)

    def inside(self) -> bool:
        """Whether the calling thread is inside the engine: in a task's ``post``/``progress`` or a
        callback the engine runs (it holds the engine's lock), where submitting and waiting for
        more work would run the engine again from within itself."""
        return self.lock._is_owned()  # type: ignore[attr-defined]  # noqa: SLF001 - RLock's own test

    def adopt(self, task: Task) -> None:
        """Take over ``task``, started outside the engine by its express lane: polled while in
        progress, with its deadline."""
        task.ctx = self
        if task.state is IN_PROGRESS:
            if task.timeout is not None:
                self._set_deadline(task)
            self._active.append(task)

    def enqueue(self, task: Task) -> None:
        """Queue ``task``, whose dependencies are done, by its effective priority (called by tasks'
        dependency handlers and :meth:`Task.activate`; it starts when priority and credit allow, on
        this pass or a later one)."""
        task.t_ready = _monotonic() if self.on_start is not None else 0.0
        (self._ready if task.credit else self._free).push(task, task.effective_priority)

    def release_credit(self, task: Task) -> None:
        """Give back the credit ``task`` holds (called by the task when it completes, fails or is
        canceled), so queued work may start on the next pass."""
        self.in_flight -= task.held_credit
        task.held_credit = 0

    def add_transport(self, transport: Any) -> None:
        """Poll ``transport.progress()`` on every pass (once, however often it is added)."""
        if transport not in self._transports:
            self._transports.append(transport)

    def remove_transport(self, transport: Any) -> None:
        if transport in self._transports:
            self._transports.remove(transport)

    # ----------------------------------------------------------------------------- watches
    def watch(self, look: Callable[[], Optional[bool]]) -> None:
        """Call ``look()`` every ``WATCH_S`` or so while this engine waits with nothing moving
        (a team's look at its store for a revoke: news that arrives on no transport), until it
        returns False. Watches run in whichever thread waits (a :class:`ProgressThread
        <pycoll.engine.progress_thread.ProgressThread>` too) without the engine's lock: one that
        touches tasks or transports takes :attr:`lock` itself."""
        if look not in self._watches:
            self._watches.append(look)

    def unwatch(self, look: Callable[[], Optional[bool]]) -> None:
        """Stop calling ``look``."""
        if look in self._watches:
            self._watches.remove(look)

    def look(self) -> None:
        """Run the watches, if ``WATCH_S`` passed since the last time (called when idle)."""
        now = _monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_S
        for look in list(self._watches):
            try:
                keep = look()
            except Exception:  # noqa: BLE001 - a watch that fails (its store went away) stops
                keep = False
                log.warning("pycoll: a watch failed and was dropped", exc_info=True)
            if keep is False:
                self.unwatch(look)

    def fail_owned(self, owners: Any, error: BaseException) -> int:
        """Fail every collective in this engine that one of ``owners`` built (see :meth:`owned`)
        with ``error``; the number failed. What a revoked team does to its calls in flight."""
        with self.lock:
            owned = self.owned(owners)
            for task in owned:
                task.fail(error)
            return len(owned)

    def owned(self, owners: Any) -> List[Task]:
        """The collectives queued or in progress in this engine that one of ``owners`` built
        (``task.owner``; found through the tasks queued or in progress, up their schedules: the
        outermost such task, so a schedule of the user's that holds one comes through it)."""
        with self.lock:
            owned: List[Task] = []
            queued = [t for q in (self._ready, self._free) for b in q.buckets.values() for t in b]
            for task in self._active + queued:
                mine = None
                while task is not None:
                    if task.owner is not None and task.owner in owners:
                        mine = task
                    task = task.parent
                if mine is not None and mine not in owned:
                    owned.append(mine)
            return owned

    # ----------------------------------------------------------------------------- the engine
    def progress(self) -> int:
        """One pass of the engine; returns how many things moved (0: idle)."""
        with self.lock:
            moved = 0
            for transport in self._transports:
                moved += transport.progress()
            if self._active:
                moved += self._progress_active()
            if self._deadlines:
                moved += self._expire()
            if self._ready or self._free:
                moved += self.start_ready()
            if moved or not self._ready:
                self._still_since = 0.0
            else:
                moved = self._start_stalled()
            return moved

    def _start_stalled(self) -> int:
        """Nothing moved and work waits for credit: after ``stall_s`` of that, start the most
        urgent waiting task whatever the credit.

        A peer's message starts a credit-blocked collective (``watch_demand``), but a rank whose
        first move is to send and to whom nobody sends first (the extra ranks that recursive
        doubling and halving fold into a neighbour, tree leaves, roots) learns of nothing: if
        the collectives holding its credit wait on peers that wait on it, nothing moves again
        (found with 150 tagged collectives in per-rank orders on 6 and 7 ranks under 4 KiB).
        Standing still that long is the sign; the credit is overdrawn by one task."""
        now = _monotonic()
        if not self._still_since:
            self._still_since = now
            return 0
        if now - self._still_since < self.stall_s:
            return 0
        self._still_since = 0.0
        ready = self._ready
        while ready:
            task = ready.pop()
            if task.state is NOT_READY:
                self.stats["stall_starts"] += 1
                self._start(task, task.credit)
                return 1
        return 0

    def _progress_active(self) -> int:
        finished = 0
        still: List[Task] = []
        for task in self._active:
            if task.state is IN_PROGRESS:
                try:
                    task.progress()
                except Exception as exc:
                    task.fail(exc)
                if task.state is IN_PROGRESS:
                    still.append(task)
                    continue
            finished += 1
        self._active[:] = still  # (in place: an express lane watches this list)
        return finished

    def _expire(self) -> int:
        """Fail tasks past their deadline; drop entries of tasks that finished in time."""
        deadlines = self._deadlines
        while deadlines and (deadlines[0][2].state is not IN_PROGRESS
                             or deadlines[0][2].t_start != deadlines[0][3]):
            _heappop(deadlines)
        if not deadlines or deadlines[0][0] > _monotonic():
            return 0
        now = _monotonic()
        expired = 0
        asked = False  # the peers are asked about the first collective that expires in a pass only
        while deadlines and deadlines[0][0] <= now:
            _, _, task, started_at = _heappop(deadlines)
            if task.state is IN_PROGRESS and task.t_start == started_at:
                waiting = task.waiting_on() if isinstance(task, Schedule) else [task]
                what = "; ".join(t.describe() for t in waiting[:8]) or "nothing left"
                if len(waiting) > 8:
                    what += f"; and {len(waiting) - 8} more"
                peers = "" if asked else self._peers_of(task, waiting)
                asked = asked or bool(peers)
                task.fail(TimeoutError(
                    f"{task.name} did not finish within {task.timeout:g} s; waiting on: {what}{peers}",
                    task=task, waiting_on=waiting, seconds=task.timeout))
                expired += 1
        return expired

    def start_ready(self) -> int:
        """Start queued tasks by priority, those that take credit only while it allows; returns
        how many started. The engine's own step; call it (under :attr:`lock`) after giving the
        engine more credit, so what it now allows starts at once."""
        started = 0
        while True:
            n = self._start_free() + self._start_credited()
            if not n:
                return started
            started += n

    def _start_free(self) -> int:
        free = self._free
        started = 0
        while free:
            task = free.pop()
            if task.state is NOT_READY:
                started += 1
                self._start(task, 0)
        return started

    def _start_credited(self) -> int:
        ready = self._ready
        started = 0
        limit = self.credit_bytes
        while ready:
            task = ready.head()
            if task.state is not NOT_READY:  # canceled while queued
                ready.pop()
                continue
            need = task.credit
            # a task that will be split starts at once: its fragments queue for credit themselves
            splits = self.partition_bytes and task.nbytes > self.partition_bytes
            if need and limit and self.in_flight and self.in_flight + need > limit and not splits:
                self.stats["credit_waits"] += 1
                if self._demand_of:
                    started += self._start_demanded()
                break
            ready.pop()
            started += 1
            self._start(task, need)
        return started

    def watch_demand(self, task: Task, transport: Any, key: tuple) -> None:
        """Start ``task`` regardless of credit once a message of the collective with message key
        ``key`` arrives on ``transport`` before its receive (a peer has started it)."""
        where = (transport, transport.demand_id(key))
        self._demand.setdefault(where, []).append(task)
        self._demand_of[task] = where
        self._demand_check.append(task)
        entry = self._demand_tls.get(id(transport))
        if entry is None:
            entry = self._demand_tls[id(transport)] = [transport, 0]
            transport.watch_arrivals()
        entry[1] += 1

    def _unwatch(self, task: Task) -> None:
        where = self._demand_of.pop(task)
        tasks = self._demand[where]
        tasks.remove(task)
        if not tasks:
            del self._demand[where]
        entry = self._demand_tls[id(where[0])]
        entry[1] -= 1
        if not entry[1]:
            del self._demand_tls[id(where[0])]
            where[0].unwatch_arrivals()  # nobody listens: stop listing

    def _start_demanded(self) -> int:
        """Start credit-blocked tasks whose peers already started them (see ``watch_demand``):
        those whose demand id arrived since the last look, and those watched since then whose
        messages were already there."""
        check, self._demand_check = self._demand_check, []
        for transport, _ in list(self._demand_tls.values()):
            transport.poll_unexpected()
            arrived = transport.take_arrivals()
            if arrived is None:  # too many to list: look at every watched task
                check.extend(t for t in self._demand_of if self._demand_of[t][0] is transport)
                continue
            for did in arrived:
                check.extend(self._demand.get((transport, did), ()))
        started = 0
        for task in check:
            where = self._demand_of.get(task)
            if where is None:  # started (or dropped) already
                continue
            if task.state is not NOT_READY:
                self._unwatch(task)
            elif task.pending:  # not ready yet: look again next time
                self._demand_check.append(task)
            elif where[0].has_unexpected_id(where[1]):
                self.stats["demand_starts"] += 1
                started += 1
                self._start(task, task.credit)  # its queue entry is skipped when popped
        return started

    def _start(self, task: Task, need: int) -> None:
        """Post one task: take its credit, publish STARTED, call ``post()``."""
        if self._demand_of and task in self._demand_of:
            self._unwatch(task)
        task.state = IN_PROGRESS
        self.posted += 1
        if self.on_start is not None:
            self.on_start(task)
        if task.listened >> _STARTED & 1:
            task.notify(_STARTED)
        pb = self.partition_bytes
        if pb and task.nbytes > pb:
            parts = task.split(pb)
            if parts:
                self._start_partitioned(task, parts)
                if task.state is IN_PROGRESS and task.timeout is not None:
                    self._set_deadline(task)
                return
        self._post(task, need)

    def _post(self, task: Task, need: int) -> None:
        """Take the credit of a started task and call its ``post()``; if it is still in progress
        after that, give it its deadline (a task that finished in ``post()`` cannot time out: it
        gets none) and poll it (if it is polled)."""
        if need:
            self.in_flight += need
            task.held_credit = need
        try:
            task.post()
        except Exception as exc:
            task.fail(exc)
            return
        if task.state is IN_PROGRESS:
            if task.timeout is not None:
                self._set_deadline(task)
            if task.polled:
                self._active.append(task)

    def _set_deadline(self, task: Task) -> None:
        """Fail ``task`` with TimeoutError if it is still in progress ``task.timeout`` s from now."""
        timeout = task.timeout
        if timeout != math.inf:
            task.t_start = t = _monotonic()
            _heappush(self._deadlines, (t + timeout, id(task), task, t))

    def _start_partitioned(self, task: Task, parts: List[Task]) -> None:
        self.stats["partitioned"] += 1
        sched = Schedule(name=f"{task.name}/parts")
        for part in parts:
            if part.priority is None:
                part.priority = task.effective_priority
            sched.add(part)
        task.parts = sched
        sched.owner = task.owner  # (its parts are the collective's: failing them fails it)
        sched.subscribe(Event.COMPLETED, task, _parts_completed)
        sched.subscribe(Event.ERROR, task, _parts_failed)
        sched.subscribe(Event.CANCELED, task, _parts_failed)
        sched.effective_priority = task.effective_priority
        sched.state = IN_PROGRESS
        sched.ctx = self
        sched.post()

    # ----------------------------------------------------------------------------- waiting
    def wait_for(self, task: Task, timeout: Optional[float] = None) -> None:
        """Drive the engine until ``task`` finishes or ``timeout`` seconds pass (then raise
        :class:`pycoll.TimeoutError`; the task keeps running)."""
        if task.state in FINISHED:
            return
        deadline = _monotonic() + timeout if timeout is not None else None
        backoff = None
        progress = self.progress
        while task.state is NOT_READY or task.state is IN_PROGRESS:
            if progress():
                if backoff is not None:
                    backoff.reset()
                continue
            if backoff is None:
                backoff = Backoff(*self.backoff)
            if deadline is not None and _monotonic() >= deadline:
                waiting = task.waiting_on() if isinstance(task, Schedule) else [task]
                what = "; ".join(t.describe() for t in waiting[:8]) or task.describe()
                raise TimeoutError(f"wait: {task.name} did not finish within {timeout:g} s; "
                                   f"waiting on: {what}{self._peers_of(task, waiting)}", task=task,
                                   waiting_on=waiting, seconds=timeout)
            if self._watches:
                self.look()
            backoff.idle(self._nap())

    @staticmethod
    def _peers_of(task: Task, waiting: List[Task]) -> str:
        """What the team's peers say they do about ``task`` (a collective that timed out), where
        its team can ask them (``owner.explain_wait``); else empty."""
        owner = task.owner if task.owner is not None else getattr(getattr(task, "task", None), "owner", None)
        explain = getattr(owner, "explain_wait", None)
        if explain is None:
            return ""
        try:
            return explain(task, waiting)
        except Exception:  # noqa: BLE001 - the timeout's own text matters more than the peers'
            log.warning("pycoll: asking the peers of a timed-out collective failed", exc_info=True)
            return ""

    def in_progress(self) -> List[Task]:
        """The polled tasks in progress now (a copy)."""
        return list(self._active)

    def _nap(self) -> Optional[Callable[[float], bool]]:
        """How to sleep until work moves, when the engine waits on one task and it can tell
        (a task's ``sleep(timeout_s)``: segment collectives sleep on the flag they wait for);
        else None (the back-off yields and sleeps)."""
        active = self._active
        if len(active) == 1 and not self._ready and not self._free:
            return getattr(active[0], "sleep", None)
        return None

    def run(self) -> None:
        """Progress until nothing is queued or in flight (for tests and simple drivers)."""
        backoff = Backoff(*self.backoff)
        while self._ready or self._free or self._active or self.in_flight:
            if self.progress():
                backoff.reset()
            else:
                if self._watches:
                    self.look()
                backoff.idle()

    def local_ranks(self, n: int) -> None:
        """This process shares its host with ``n`` ranks of a team: if they outnumber the cores,
        waiting ranks yield at once and keep yielding rather than sleep, so the rank everyone
        waits for gets a core soon; only a wait past 1 ms sleeps on the flag (measured, 4 ranks on
        2 cores, 8 B allreduce: sleeping on the flag at once 100 us a call, yielding 45)."""
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        if n > cores:
            self.backoff = (0.0, 0.1, 20e-6, 1e-3, 1e-3)
            self.oversubscribed = True

    oversubscribed = False

    def pending(self) -> int:
        """Tasks queued or polled in flight."""
        return self._ready.size() + self._free.size() + len(self._active)


_default: Optional[Context] = None
_default_lock = threading.Lock()


def get_context() -> Context:
    """The process's default context (created on first use from the ``PYCOLL_*`` settings)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Context()
    return _default



__all__ = ["Backoff", "Context", "Request", "get_context", "COMPLETED", "ERROR", "CANCELED"]
