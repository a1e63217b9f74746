"""The scheduler: named tensors by priority, in partitions, under the engine's credit.

ByteScheduler's loop (``shared/seeds/001``): partition every tensor larger than the partition size,
queue the parts of a ready tensor by priority (its layer index: the layer nearest the input is
the most urgent), send while the credit (bytes in flight) allows. Here the queue and the credit are
the progress engine's own (:mod:`pycoll.engine.context`); the scheduler only cuts tensors into
parts and posts each part as a collective with

* engine priority ``priority * PART_STRIDE + part_index`` (lower starts first; parts of one
  tensor go in order; a more urgent tensor's parts overtake queued parts of a less urgent one);
* tag ``("sched", name, part_index)``: ranks match parts by tensor name and part, so they may make
  tensors ready in any order, and the engine starts a part a peer already started whatever the
  credit (no two ranks wait on each other; no coordinator, unlike ByteScheduler's rank 0 over
  Horovod);
* credit: each part holds its bytes while in flight.

An ``immediate`` tensor bypasses all of that: one collective, no partitions, no credit, the most
urgent priority. :meth:`Scheduler.step` marks a training step's end: it feeds the auto-tuner
(:mod:`pycoll.scheduling.tuning`), which changes credit and partition size on every rank at the
same step.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from pycoll import config, trace
from pycoll.buffers import as_array
from pycoll.engine.progress_thread import progress_thread
from pycoll.engine.request import Request
from pycoll.errors import PycollError
from pycoll.ops import ReduceOp, as_op
from pycoll.scheduling.tuning import AutoTuner

#: Engine priority of part ``i`` of a tensor of priority ``p``: ``p * PART_STRIDE + i``.
PART_STRIDE = 1 << 20
#: Engine priority of immediate tensors and of the tuner's control messages.
IMMEDIATE = -(1 << 62)

Callback = Callable[["ScheduledTensor", Optional[BaseException]], None]


class ScheduledTensor:
    """One submitted tensor: its parts' requests and its completion.

    ``wait()`` drives the engine until every part finished (raising the first error);
    ``done`` says whether they have. The ``on_done`` callback given to
    :meth:`Scheduler.submit` runs once, in the thread that sees the last part finish."""

    def __init__(self, sched: Scheduler, name: str, array: np.ndarray, priority: int, op: ReduceOp,
                 immediate: bool, on_done: Optional[Callback]) -> None:
        self.scheduler = sched
        self.name = name
        self.array = array
        self.priority = priority
        self.op = op
        self.immediate = immediate
        self.on_done = on_done
        self.partition_bytes = 0  # the partition size its parts were cut at (0: one piece)
        self.requests: List[Request] = []
        self.t_submit = time.monotonic()
        self.t_ready: Optional[float] = None
        self.t_done: Optional[float] = None
        self.error: Optional[BaseException] = None
        self._called = False
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return self.t_ready is not None

    @property
    def done(self) -> bool:
        """True once every part finished (without progressing the engine)."""
        return self.ready and all(r.done for r in self.requests)

    def test(self) -> bool:
        """Progress the engine once; True when every part finished (raises a part's error)."""
        if not self.ready:
            self.scheduler.team.ctx.progress()
            return False
        for req in self.requests:
            if not req.done and not req.test():
                return False
        self.finish()
        return True

    def wait(self, timeout: Optional[float] = None) -> np.ndarray:
        """Wait for every part; returns the reduced array (in place)."""
        if not self.ready:
            raise PycollError(f"scheduled tensor {self.name!r} was never made ready (notify_ready)")
        deadline = None if timeout is None else time.monotonic() + timeout
        for req in self.requests:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                req.wait(left)
            except PycollError as exc:
                if not req.done:  # timed out waiting: the parts go on
                    raise
                self.finish(exc)
                raise
        self.finish()
        if self.error is not None:
            raise self.error
        return self.array

    def finish(self, error: Optional[BaseException] = None) -> None:
        """Run the completion once every part finished (``error``: the first failure, else the
        parts' own is looked up); from ``wait``/``test`` or the progress thread, whichever is
        first (later calls do nothing)."""
        with self._lock:
            if self._called:
                return
            self._called = True
        if error is None:
            for req in self.requests:
                if req.error is not None:
                    error = req.error
                    break
        self.error = error
        self.t_done = time.monotonic()
        self.scheduler.tensor_done(self)
        if self.on_done is not None:
            self.on_done(self, error)

    def __repr__(self) -> str:
        state = "done" if self.done else ("in flight" if self.ready else "not ready")
        return f"<ScheduledTensor {self.name!r} priority {self.priority} {state}>"


class Scheduler:
    """ByteScheduler-style communication scheduling on a team.

    Args:
        team: the :class:`pycoll.Team` the tensors are reduced across.
        partition_bytes: cut tensors into parts of at most this size (default
            ``PYCOLL_SCHED_PARTITION_BYTES``; 0: never). Equal on every rank.
        credit_bytes: the engine's credit (bytes in flight) to set (default: keep the engine's
            ``PYCOLL_CREDIT_BYTES``, or 4 partitions if that is unlimited). Credit is one budget
            for all of the process's communication, as ByteScheduler's.
        tuning: what the auto-tuner tunes: ``"credit"``, ``"partition"``, ``"credit,partition"``
            or ``"off"`` (default ``PYCOLL_SCHED_TUNING``), or an :class:`~pycoll.scheduling.AutoTuner`.
        background: complete tensors (run ``on_done``) from the engine's progress thread, for
            callers that never wait (frameworks); else completions run in ``wait``/``test``.
        timeout: seconds a part may take (default ``PYCOLL_TIMEOUT``).
        collective: ``"allreduce"`` (default) or ``"push_pull"`` (BytePS push-sum-pull through
            the team's summation services, :meth:`pycoll.Team.push_pull`; SUM or AVG).
    """

    def __init__(self, team: Any, *, partition_bytes: Any = None, credit_bytes: Any = None,
                 tuning: Any = None, background: bool = False, timeout: Optional[float] = None,
                 collective: str = "allreduce") -> None:
        self.team = team
        self.ctx = team.ctx
        if partition_bytes is None:
            partition_bytes = config.get("PYCOLL_SCHED_PARTITION_BYTES")
        self.partition_bytes = _bytes(partition_bytes, "partition_bytes")
        if credit_bytes is not None:
            self.ctx.credit_bytes = _bytes(credit_bytes, "credit_bytes")
        elif not self.ctx.credit_bytes:
            self.ctx.credit_bytes = 4 * self.partition_bytes if self.partition_bytes else 0
        if collective not in ("allreduce", "push_pull"):
            raise ValueError(f"collective must be 'allreduce' or 'push_pull', got {collective!r}")
        self.collective = collective
        self.timeout = timeout
        self.background = background
        self._progress = progress_thread(self.ctx) if background else None
        self.pending: Dict[str, ScheduledTensor] = {}  # submitted, not finished
        self._lock = threading.Lock()
        self.step_count = 0
        self._t_step = time.monotonic()
        self.step_times: List[float] = []
        self.bytes_per_step = 0  # most bytes submitted in one step so far
        self._step_bytes = 0
        #: (step, credit_bytes, partition_bytes) whenever the tuner changed them.
        self.history: List[tuple] = [(0, self.ctx.credit_bytes, self.partition_bytes)]
        if isinstance(tuning, AutoTuner):
            self.tuner: Optional[AutoTuner] = tuning
        else:
            what = config.get("PYCOLL_SCHED_TUNING") if tuning is None else tuning
            self.tuner = AutoTuner.from_setting(what)
        if self.tuner is not None:
            self.tuner.bind(self)
        tracer = trace.tracer()
        if tracer is not None:
            tracer.step(0)  # steps count from 0; step k starts at the k-th step() call

    # ------------------------------------------------------------------ submission
    def submit(self, name: str, tensor: Any, priority: int = 0, *, op: Any = ReduceOp.SUM,
               ready: bool = True, immediate: bool = False,
               on_done: Optional[Callback] = None) -> ScheduledTensor:
        """Allreduce ``tensor`` in place, scheduled by ``priority`` (lower first: a layer's index
        from the input). ``name`` matches it across ranks (unique among unfinished tensors,
        equal on every rank); ``ready=False`` holds it until :meth:`notify_ready`;
        ``immediate=True`` sends it at once, whole, outside priority and credit; ``on_done(t,
        error)`` runs once when it finished."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a scheduled tensor needs a non-empty name, got {name!r}")
        if not isinstance(priority, (int, np.integer)) or isinstance(priority, bool):
            raise TypeError(f"priority must be an integer (layer index), got {priority!r}")
        if not -PART_STRIDE <= int(priority) < PART_STRIDE:
            raise ValueError(f"priority must be in [-{PART_STRIDE}, {PART_STRIDE}), got {priority}")
        arr = as_array(tensor, writable=True)
        if arr.ndim != 1:
            arr = arr.reshape(-1)
        rop = as_op(op)
        if self.collective == "push_pull" and rop not in (ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(f"push_pull sums (SUM or AVG), not {rop.name}")
        entry = ScheduledTensor(self, name, arr, int(priority), rop, immediate, on_done)
        with self._lock:
            if name in self.pending:
                raise ValueError(f"tensor {name!r} is already scheduled and not finished")
            self.pending[name] = entry
        if ready:
            self._post(entry)
        return entry

    def notify_ready(self, name: str) -> ScheduledTensor:
        """The data of tensor ``name`` (submitted with ``ready=False``) is there: queue it."""
        with self._lock:
            entry = self.pending.get(name)
        if entry is None:
            raise KeyError(f"no scheduled tensor named {name!r} waits to be made ready")
        if entry.ready:
            raise ValueError(f"tensor {name!r} was already made ready")
        self._post(entry)
        return entry

    def _post(self, entry: ScheduledTensor) -> None:
        team, arr = self.team, entry.array
        entry.t_ready = time.monotonic()
        self._step_bytes += arr.nbytes
        if (entry.immediate or self.team.size == 1) and self.collective == "push_pull":
            entry.requests = [team.push_pull(arr, name=f"{entry.name}!", priority=IMMEDIATE,
                                             average=entry.op is ReduceOp.AVG, timeout=self.timeout)]
        elif entry.immediate or self.team.size == 1:
            entry.requests = [team.submit("allreduce", arr, None, entry.op, priority=IMMEDIATE,
                                          tag=("sched", entry.name), timeout=self.timeout,
                                          name=f"{entry.name}!", credit=False)]
        else:
            pb = self.partition_bytes
            per = max(1, pb // arr.itemsize) if pb else max(1, arr.size)
            entry.partition_bytes = pb
            base = entry.priority * PART_STRIDE
            reqs = []
            with self.ctx.lock:  # all parts queued before the engine starts any: priority decides
                for i, lo in enumerate(range(0, max(arr.size, 1), per)):
                    if self.collective == "push_pull":
                        reqs.append(team.push_pull(arr[lo:lo + per], name=f"{entry.name}/part{i}",
                                                   priority=base + i, average=entry.op is ReduceOp.AVG,
                                                   timeout=self.timeout))
                        continue
                    reqs.append(team.submit("allreduce", arr[lo:lo + per], None, entry.op, priority=base + i,
                                            tag=("sched", entry.name, i), timeout=self.timeout,
                                            name=f"{entry.name}/part{i}"))
            entry.requests = reqs
        if self._progress is not None:
            self._progress.watch(entry.requests, lambda error, e=entry: e.finish(error))

    def tensor_done(self, entry: ScheduledTensor) -> None:
        """``entry`` finished (its :meth:`ScheduledTensor.finish` calls this): its name is free."""
        with self._lock:
            if self.pending.get(entry.name) is entry:
                del self.pending[entry.name]

    # ------------------------------------------------------------------ steps
    def step(self) -> None:
        """Mark the end of a training step (call it at the same point on every rank): records the
        step time, and lets the auto-tuner apply settings agreed for this step."""
        now = time.monotonic()
        self.step_times.append(now - self._t_step)
        self._t_step = now
        self.step_count += 1
        self.bytes_per_step = max(self.bytes_per_step, self._step_bytes)
        self._step_bytes = 0
        tracer = trace.tracer()
        if tracer is not None:
            tracer.step(self.step_count)
        if self.tuner is not None:
            self.tuner.on_step(self.step_count, self.step_times[-1])

    def apply(self, credit_bytes: Optional[int] = None, partition_bytes: Optional[int] = None) -> None:
        """Change credit and partition size now (the tuner calls it at a step boundary on every
        rank; tensors submitted from now on are cut at the new size)."""
        changed = False
        if credit_bytes is not None and credit_bytes != self.ctx.credit_bytes:
            with self.ctx.lock:
                self.ctx.credit_bytes = int(credit_bytes)
                self.ctx.start_ready()  # more credit: start what it now allows
            changed = True
        if partition_bytes is not None and partition_bytes != self.partition_bytes:
            self.partition_bytes = int(partition_bytes)
            changed = True
        if changed:
            self.history.append((self.step_count, self.ctx.credit_bytes, self.partition_bytes))

    @property
    def credit_bytes(self) -> int:
        return self.ctx.credit_bytes

    def synchronize(self, timeout: Optional[float] = None) -> None:
        """Wait for every ready tensor (raises the first error)."""
        with self._lock:
            entries = [e for e in self.pending.values() if e.ready]
        for entry in entries:
            entry.wait(timeout)

    def __repr__(self) -> str:
        return (f"<Scheduler on {self.team!r}: partition {self.partition_bytes} B, credit "
                f"{self.ctx.credit_bytes} B, {len(self.pending)} pending>")


def _bytes(value: Any, what: str) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{what} must be >= 0, got {value}")
        return int(value)
    return config.parse_bytes(str(value))
