"""Timelines: ``PYCOLL_TRACE=file.json`` writes a Chrome/Perfetto trace per rank.

Load a file in https://ui.perfetto.dev or ``chrome://tracing``; combine ranks with ``pycoll trace
merge`` and draw one training step with ``pycoll trace plot``.

What is recorded (Trace Event Format, ``ph: "X"`` complete events and ``ph: "i"`` instants):

* for every task the engine starts, its **communication span** (start to finish; ``args.outcome``
  is completed, error or canceled) and, for collectives and their parts, its **queue wait** (from
  ready, i.e. dependencies done and queued, to start: the time priority and credit held it back),
  with args ``name``, ``priority``, ``nbytes``, ``credit`` (bytes of credit it held),
  ``in_flight`` (the engine's credit in flight when it started), ``credit_limit``, ``wait_us``
  and ``start`` (queue, submit: started at once, demand: a peer started it, stall). Categories:
  ``comm`` (collectives and their parts: tasks that take credit, tasks submitted on their own),
  ``queue`` (their waits) and ``subtask`` (tasks inside a collective's schedule: sends, receives,
  reductions);
* with ``PYCOLL_TRACE_INSTRUCTIONS=1``, a native program's instructions (category ``subtask``:
  issued to done, with ``peer``, ``nbytes`` and the collective's ``parent`` name);
* what the program marks with :meth:`Tracer.span`, :meth:`Tracer.complete`,
  :meth:`Tracer.instant` and :meth:`Tracer.step` (forward and backward passes, training steps).

Lanes: a Chrome viewer draws the X events of one thread id as a stack that must nest, so spans
that overlap (collectives in flight together) go on separate lanes: each lane is a ``tid`` named by
``thread_name`` metadata (``comm 0``, ``comm 1``, ``queue 0``, ..., ``subtasks 0``, and one lane
per program thread for its spans, which nest). Engine lanes never hold two overlapping spans, so a
Gantt chart can use one row per lane. Lanes are assigned when the file is written.

Clocks: ``ts`` is wall-clock microseconds since the epoch: ``time.time()`` read once when the tracer
starts plus ``time.monotonic()`` offsets, so ranks on one machine line up exactly and ranks on
different machines as well as their clocks agree. ``pid`` is the rank (the launcher's rank when
known: ``PMI_RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK``, ``RANK``; else the process id).

The file is written at interpreter exit and by :meth:`Tracer.flush` (the whole trace each time,
to a temporary file renamed into place). With ``PYCOLL_TRACE`` unset nothing is recorded and the
engine pays nothing: contexts get no ``on_start`` hook.
"""

from __future__ import annotations

import atexit
import heapq
import json
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

from pycoll import config
from pycoll.events.manager import Event
from pycoll.topology import launcher_rank

_monotonic = time.monotonic

#: Category of each kind of span (the plot colours them).
CAT_COMM = "comm"
CAT_QUEUE = "queue"
CAT_SUBTASK = "subtask"
CAT_STEP = "step"

#: Lane groups, in display order: program threads first, then the engine's lanes.
_GROUP_NAMES = {CAT_COMM: "comm", CAT_QUEUE: "queue", CAT_SUBTASK: "subtasks"}
_ENGINE_GROUPS = (CAT_COMM, CAT_QUEUE, CAT_SUBTASK)

_OUTCOME = {Event.COMPLETED: "completed", Event.ERROR: "error", Event.CANCELED: "canceled"}


def rank_and_source() -> Tuple[int, str]:
    """(rank, "launcher") from the launcher's environment, else (pid, "pid")."""
    rank = launcher_rank()
    if rank is not None:
        return rank, "launcher"
    return os.getpid(), "pid"


def rank_path(template: str, rank: Any) -> str:
    """The file of rank ``rank``: ``{rank}`` in ``template`` replaced, else ``.rank<r>`` inserted
    before the extension (``trace.json`` -> ``trace.rank0.json``; no extension: appended)."""
    if "{rank}" in template:
        return template.replace("{rank}", str(rank))
    head, tail = os.path.split(template)
    stem, ext = os.path.splitext(tail)
    if not stem:  # ".json": a hidden file without a stem
        stem, ext = tail, ""
    return os.path.join(head, f"{stem}.rank{rank}{ext}")


class _Hook:
    """``ctx.on_start`` of a traced context (chains a hook that was there before)."""

    __slots__ = ("tracer", "ctx", "prev", "ctx_id", "demand", "stall")

    def __init__(self, tracer: Tracer, ctx: Any, prev: Any, ctx_id: int) -> None:
        self.tracer = tracer
        self.ctx = ctx
        self.prev = prev
        self.ctx_id = ctx_id
        # the engine's counts of tasks started by a peer's demand or a stall (they count up
        # just before such a start)
        self.demand = ctx.stats.get("demand_starts", 0)
        self.stall = ctx.stats.get("stall_starts", 0)

    def __call__(self, task: Any) -> None:
        if self.prev is not None:
            self.prev(task)
        t = _monotonic()
        ready = task.t_ready
        task.t_ready = 0.0  # consumed: a task re-posted without queueing must not reuse it
        stats = self.ctx.stats
        demand, stall = stats.get("demand_starts", 0), stats.get("stall_starts", 0)
        if demand != self.demand:
            self.demand = demand
            how = "demand"
        elif stall != self.stall:
            self.stall = stall
            how = "stall"
        elif ready and ready <= t:
            how = "queue"
        else:
            how = "submit"
        if not ready or ready > t:
            ready = t
        self.tracer.task_started(task, self.ctx, how, ready, t, self.ctx_id)


class Tracer:
    """Records one process's timeline and writes it as Chrome Trace Event JSON.

    Make one with :func:`tracer` (from ``PYCOLL_TRACE``); a Tracer made directly records the same
    way and writes to ``path`` (a template: see :func:`rank_path`).
    """

    #: Events kept at most (then new ones are counted in ``otherData.dropped`` and not kept).
    max_events = 4_000_000

    def __init__(self, path: str, rank: Optional[int] = None) -> None:
        self.template = path
        if rank is None:
            self.rank, self.rank_source = rank_and_source()
        else:
            self.rank, self.rank_source = int(rank), "given"
        self._pid = os.getpid()
        # the clock: wall time at start, monotonic offsets after it
        self._mono0 = _monotonic()
        self._wall0_us = time.time() * 1e6
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        # finished records: (kind, group, lane key, name, cat, t0, t1, args); kind "X" or "i"
        self._records: List[tuple] = []
        self._open: Dict[Any, list] = {}  # task -> [t_start, args, group] while in progress
        self._threads: Dict[int, str] = {}  # thread ident -> name, in order of first use
        self._contexts = 0
        self.dropped = 0

    # ----------------------------------------------------------------------------- clock
    def _us(self, t: float) -> float:
        """Trace timestamp (wall-clock µs) of a ``time.monotonic()`` reading."""
        return self._wall0_us + (t - self._mono0) * 1e6  # ~0.25 us resolution at today's epoch

    @property
    def path(self) -> str:
        """The file this process's trace is written to."""
        return rank_path(self.template, self.rank)

    def set_rank(self, rank: int) -> None:
        """Name this process by ``rank`` (when the launcher's environment did not give it; e.g.
        once ``torch.distributed`` knows it). Takes effect at the next write."""
        self.rank, self.rank_source = int(rank), "given"

    # ----------------------------------------------------------------------------- engine side
    def attach(self, ctx: Any) -> None:
        """Trace the tasks ``ctx`` starts (idempotent; keeps an ``on_start`` hook already set)."""
        hook = ctx.on_start
        while isinstance(hook, _Hook):
            if hook.tracer is self:
                return
            hook = hook.prev
        with self._lock:
            ctx_id = self._contexts
            self._contexts += 1
        ctx.on_start = _Hook(self, ctx, ctx.on_start, ctx_id)

    def task_started(self, task: Any, ctx: Any, how: str, ready: float, t: float, ctx_id: int = 0) -> None:
        """Record that context ``ctx`` (the tracer's ``ctx_id``-th) started ``task`` at ``t``, queued
        since ``ready`` (``time.monotonic()`` readings); ``how``: queue, submit, demand or stall.
        Called by the ``on_start`` hook :meth:`attach` sets."""
        parent = task.parent
        if parent is None or task.credit or parent not in self._open or "/parts" in parent.name:
            group = CAT_COMM
        else:
            group = CAT_SUBTASK
        args = {
            "name": task.name,
            "priority": task.effective_priority,
            "nbytes": task.nbytes,
            "credit": task.credit,
            "in_flight": ctx.in_flight,
            "credit_limit": ctx.credit_bytes,
            "wait_us": round((t - ready) * 1e6, 3),
            "start": how,
        }
        if parent is not None:
            args["parent"] = parent.name
        # a tagged collective's message key: ("u", tag, use), and more for its parts
        key = getattr(getattr(getattr(task, "args", None), "channel", None), "key", None)
        if isinstance(key, tuple) and len(key) >= 3 and key[0] == "u":
            args["tag"], args["tag_use"] = repr(key[1]), key[2]
        if ctx_id:
            args["ctx"] = ctx_id
        # once per task object (pooled tasks are re-posted): not if it has us as a listener already
        if not any(listener is self for listener in task.listeners(Event.COMPLETED)):
            for event, handler in _FINISH_HANDLERS:
                # ours first: the finish time is taken before listeners run
                task.subscribe_first(event, self, handler)
        with self._lock:
            self._open[task] = [t, args, group]
            if group is CAT_COMM:
                self._add(("X", CAT_QUEUE, None, task.name, CAT_QUEUE, ready, t, args))

    def task_finished(self, task: Any, event: Event) -> None:
        """Record that ``task`` finished now with ``event`` (COMPLETED, ERROR or CANCELED); called
        by the handlers :meth:`task_started` subscribes."""
        t = _monotonic()
        with self._lock:
            entry = self._open.pop(task, None)
            if entry is None:  # started before tracing began, or canceled while queued
                return
            t0, args, group = entry
            args = dict(args)
            args["outcome"] = _OUTCOME[event]
            if task.parts is not None:  # partitioned: its parts held the credit
                args["credit"] = 0
                args["parts"] = len(task.parts.tasks)
            if task.error is not None:
                args["error"] = f"{type(task.error).__name__}: {task.error}"[:300]
            self._add(("X", group, None, task.name, group, t0, t, args))

    def subtasks(self, spans: List[Tuple[str, float, float, Dict[str, Any]]]) -> None:
        """Record finished parts of a collective that the engine did not run as tasks of their own
        (a native program's instructions, ``PYCOLL_TRACE_INSTRUCTIONS``): ``(name, t0, t1, args)``
        each, ``time.monotonic()`` readings, in the subtask lanes."""
        with self._lock:
            for name, t0, t1, args in spans:
                self._add(("X", CAT_SUBTASK, None, name, CAT_SUBTASK, t0, t1, args))

    def _add(self, record: tuple) -> None:
        if len(self._records) < self.max_events:
            self._records.append(record)
        else:
            self.dropped += 1

    # ----------------------------------------------------------------------------- program side
    def _thread_key(self) -> int:
        ident = threading.get_ident()
        if ident not in self._threads:
            self._threads[ident] = threading.current_thread().name
        return ident

    @contextmanager
    def span(self, name: str, /, cat: str = "compute", **args: Any) -> Iterator[None]:
        """Record the ``with`` block as a span in the calling thread's lane (``cat``: forward,
        backward, compute, ...). An exception leaving the block is noted in ``args.error``."""
        key = self._thread_key()
        t0 = _monotonic()
        try:
            yield
        except BaseException as exc:
            args["error"] = type(exc).__name__
            raise
        finally:
            t1 = _monotonic()
            with self._lock:
                self._add(("X", "thread", key, name, cat, t0, t1, args))

    def complete(self, name: str, /, cat: str, t0: float, t1: float, **args: Any) -> None:
        """Record a finished span from ``t0`` to ``t1`` (``time.monotonic()`` readings) in the
        calling thread's lane."""
        key = self._thread_key()
        with self._lock:
            self._add(("X", "thread", key, name, cat, float(t0), float(t1), args))

    def instant(self, name: str, /, cat: str = "mark", **args: Any) -> None:
        """Record a point in time in the calling thread's lane."""
        key = self._thread_key()
        t = _monotonic()
        with self._lock:
            self._add(("i", "thread", key, name, cat, t, t, args))

    def step(self, n: int) -> None:
        """Mark the start of training step ``n`` (``pycoll trace plot --step n`` cuts the trace
        from this mark to the next step's)."""
        key = self._thread_key()
        t = _monotonic()
        with self._lock:
            self._add(("i", "step", key, f"step {int(n)}", CAT_STEP, t, t, {"step": int(n)}))

    # ----------------------------------------------------------------------------- output
    def events(self) -> List[dict]:
        """The trace so far as Trace Event dicts (tasks still in progress end now, with
        ``outcome`` in_progress), lanes assigned, metadata first."""
        now = _monotonic()
        with self._lock:
            records = list(self._records)
            for task, (t0, args, group) in self._open.items():
                args = dict(args, outcome="in_progress")
                records.append(("X", group, None, task.name, group, t0, now, args))
            threads = dict(self._threads)
        pid = self.rank
        us = self._us
        # lanes: per program thread (nesting allowed), then per engine group (no overlap at all)
        spans: Dict[tuple, list] = {}
        instants = []
        for kind, group, key, name, cat, t0, t1, args in records:
            ts = us(t0)
            if kind == "i":
                instants.append((group, key, name, cat, ts, args))
                continue
            dur = max(0.0, round((t1 - t0) * 1e6, 3))
            spans.setdefault((group, key), []).append((ts, dur, name, cat, args))
        order = [("thread", k) for k in threads] + [(g, None) for g in _ENGINE_GROUPS]
        out: List[dict] = []
        meta: List[dict] = []
        thread_tid: Dict[int, int] = {}
        next_tid = 1
        for group, key in order:
            items = spans.get((group, key))
            if group == "thread":
                if not items and not any(i[1] == key for i in instants):
                    continue
                label = threads[key]
                thread_tid[key] = next_tid
            elif not items:
                continue
            else:
                label = _GROUP_NAMES[group]
            lanes = _assign_lanes(items or [], nest=group == "thread")
            n_lanes = max(lanes, default=0) + 1
            for (ts, dur, name, cat, args), lane in zip(items or [], lanes):
                out.append({"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid,
                            "tid": next_tid + lane, "args": args})
            for lane in range(n_lanes):
                if group == "thread":
                    lane_name = label if not lane else f"{label} ({lane + 1})"
                else:
                    lane_name = f"{label} {lane}"
                meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": next_tid + lane,
                             "args": {"name": lane_name}})
                meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": next_tid + lane,
                             "args": {"sort_index": next_tid + lane}})
            next_tid += n_lanes
        for group, key, name, cat, ts, args in instants:
            ev = {"name": name, "cat": cat, "ph": "i", "ts": ts, "pid": pid,
                  "tid": thread_tid.get(key, 0), "s": "p" if group == "step" else "t", "args": args}
            out.append(ev)
        out.sort(key=lambda e: e["ts"])
        label = f"rank {pid}" if self.rank_source != "pid" else f"pid {pid}"
        head = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}},
                {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                 "args": {"sort_index": pid}}]
        return head + meta + out

    def to_json(self) -> dict:
        """The whole trace document (``traceEvents`` plus pycoll's ``otherData``)."""
        events = self.events()
        return {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {
                "pycoll_trace": 1,
                "rank": self.rank,
                "rank_source": self.rank_source,
                "pid": self._pid,
                "host": socket.gethostname(),
                "clock": "wall-clock us: time.time() at tracer start + time.monotonic() offsets",
                "wall_start_us": round(self._wall0_us, 3),
                "dropped": self.dropped,
            },
        }

    def flush(self) -> Optional[str]:
        """Write the trace so far to :attr:`path` (atomically: a temporary file renamed into
        place); returns the path (None in a forked child, which leaves the parent's file alone)."""
        if os.getpid() != self._pid:
            return None
        with self._write_lock:
            path = self.path
            write_json(self.to_json(), path)
        return path

    def __repr__(self) -> str:
        return f"<Tracer {self.path} rank {self.rank} ({len(self._records)} events)>"


def write_json(doc: Dict[str, Any], path: str) -> None:
    """Write ``doc`` to ``path`` through a temporary file renamed into place (a reader never sees
    half a file; a crash leaves the previous one)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        text = json.dumps(doc, separators=(",", ":"), default=str)  # the C encoder: fast
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _completed(tracer: Tracer, task: Any, data: Any) -> None:
    tracer.task_finished(task, Event.COMPLETED)


def _failed(tracer: Tracer, task: Any, data: Any) -> None:
    tracer.task_finished(task, Event.ERROR)


def _canceled(tracer: Tracer, task: Any, data: Any) -> None:
    tracer.task_finished(task, Event.CANCELED)


_FINISH_HANDLERS = ((Event.COMPLETED, _completed), (Event.ERROR, _failed), (Event.CANCELED, _canceled))


def _assign_lanes(items: List[tuple], nest: bool) -> List[int]:
    """A lane (0, 1, ...) for each (ts, dur, ...) span, taken in order of start: the lowest lane
    where it overlaps nothing (or, with ``nest``, lies wholly inside the innermost open span)."""
    order = sorted(range(len(items)), key=lambda i: (items[i][0], -items[i][1]))
    result = [0] * len(items)
    if not nest:  # interval partitioning: O(n log n) however many lanes
        busy: List[tuple] = []  # heap of (end, lane)
        free: List[int] = []  # heap of lanes
        n_lanes = 0
        for i in order:
            ts, dur = items[i][0], items[i][1]
            while busy and busy[0][0] <= ts:
                heapq.heappush(free, heapq.heappop(busy)[1])
            if free:
                lane = heapq.heappop(free)
            else:
                lane = n_lanes
                n_lanes += 1
            heapq.heappush(busy, (ts + dur, lane))
            result[i] = lane
        return result
    lanes: List[list] = []  # per lane: the end times of its open spans, innermost last
    for i in order:
        ts, dur = items[i][0], items[i][1]
        end = ts + dur
        for n, stack in enumerate(lanes):
            while stack and stack[-1] <= ts:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                result[i] = n
                break
        else:
            lanes.append([end])
            result[i] = len(lanes) - 1
    return result


# --------------------------------------------------------------------------------- the process's tracer
_tracer: Optional[Tracer] = None
_tracer_lock = threading.Lock()


def tracer() -> Optional[Tracer]:
    """The process's tracer, made on the first call that finds ``PYCOLL_TRACE`` set (None while it
    is unset). It writes its file at interpreter exit and on :meth:`Tracer.flush`."""
    global _tracer
    if _tracer is not None:
        return _tracer
    path = config.get("PYCOLL_TRACE").strip()
    if not path:
        return None
    with _tracer_lock:
        if _tracer is None:
            _tracer = Tracer(path)
            atexit.register(_flush_at_exit)
    return _tracer


def _flush_at_exit() -> None:
    """Write the process's trace at interpreter exit (registered while there is a tracer)."""
    tr = _tracer
    if tr is None:
        return
    try:
        tr.flush()
    except Exception as exc:  # never turn an exit into a traceback
        logging.getLogger("pycoll").warning("PYCOLL_TRACE: could not write %s: %s", tr.path, exc)


def attach(ctx: Any) -> None:
    """Make ``ctx`` (a :class:`pycoll.Context`) trace the tasks it starts into the process's
    tracer; nothing when tracing is off. Every Context calls it when made."""
    tr = tracer()
    if tr is not None:
        tr.attach(ctx)


def flush() -> Optional[str]:
    """Write the process's trace now (if tracing); returns the path written."""
    tr = _tracer
    return tr.flush() if tr is not None else None


def reset() -> None:
    """Forget the process's tracer without writing it (for tests: ``PYCOLL_TRACE`` is read again
    by the next :func:`tracer` call)."""
    global _tracer
    with _tracer_lock:
        if _tracer is not None:
            atexit.unregister(_flush_at_exit)
        _tracer = None


__all__ = ["Tracer", "attach", "flush", "rank_path", "reset", "tracer", "write_json"]
