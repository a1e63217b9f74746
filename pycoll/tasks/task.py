"""Tasks: the unit of work the progress engine posts, progresses and completes.

A task is an :class:`~pycoll.events.EventManager` (others subscribe to it) and a listener (it
subscribes to the tasks it depends on). Its life::

    NOT_READY --(all dependencies done, parent started; queued by priority; credit allows)--> IN_PROGRESS
    IN_PROGRESS --complete()--> COMPLETED      IN_PROGRESS --fail(exc) / exception--> ERROR
    NOT_READY | IN_PROGRESS --cancel()--> CANCELED

Write a task by subclassing :class:`Task` and overriding :meth:`Task.post` (start the work) and
:meth:`Task.progress` (advance it; called by the engine while the task is in progress); call
:meth:`Task.complete` when done. A plain ``Task()`` is a no-op that completes when posted.

The engine-task contract, task side: a task asks the engine (its :attr:`Task.ctx`) for two things,
``ctx.enqueue(task)`` when its last dependency is done and ``ctx.release_credit(task)`` when it
finishes holding credit; whoever starts it (``Context.submit``, its schedule's ``post``) calls
:meth:`Task.activate`. The fields listed as *owned by the engine* in :class:`Task` are public so that
the engine, schedules and tracers use them without a method call per task; only the engine,
schedules and a task's own reset write them.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Sequence, Union

from pycoll.buffers import as_bytes
from pycoll.events.manager import N_EVENTS, Event, EventManager, event_mask

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.engine.context import Context


class TaskState(enum.IntEnum):
    """Where a task is in its life."""

    NOT_READY = 0
    IN_PROGRESS = 1
    COMPLETED = 2
    ERROR = 3
    CANCELED = 4


NOT_READY = TaskState.NOT_READY
IN_PROGRESS = TaskState.IN_PROGRESS
COMPLETED = TaskState.COMPLETED
ERROR = TaskState.ERROR
CANCELED = TaskState.CANCELED
FINISHED = (COMPLETED, ERROR, CANCELED)

_STARTED = Event.STARTED
_COMPLETED = Event.COMPLETED
_ERROR = Event.ERROR
_CANCELED = Event.CANCELED
_COMPLETED_BIT = 1 << _COMPLETED
#: What a dependant listens to, in one subscription: the dependency's start or completion, and its
#: failure or cancelation.
_AFTER_COMPLETED = event_mask(_COMPLETED, _ERROR, _CANCELED)
_AFTER_STARTED = event_mask(_STARTED, _ERROR, _CANCELED)


# Default handlers: what a task does when a task it subscribed to publishes an event.
# Signature: handler(listener, source, data).
def dependency_done(task: Task, source: Any, data: Any) -> None:
    """A dependency completed (or started, for an ORDERED pipeline): one fewer to wait for."""
    task.pending -= 1
    if task.pending == 0 and task.state is NOT_READY:
        task.ctx.enqueue(task)


def dependency_failed(task: Task, source: Any, data: Any) -> None:
    """A dependency failed or was canceled: this task will never run; cancel it with the cause."""
    if task.state is NOT_READY:
        task.cancel(cause=getattr(source, "error", None))


def rebindable(task: Task) -> bool:
    """Whether a finished task can serve another call of its shape (kept by the planner, or as a
    persistent collective): it has ``rebind(src, dst, key)`` and does not say otherwise through a
    ``rebindable`` attribute of its own."""
    return hasattr(task, "rebind") and getattr(task, "rebindable", True)


def ignore(task: Task, source: Any, data: Any) -> None:
    """Handler that does nothing."""


_DEFAULT_HANDLERS = [ignore] * N_EVENTS
_DEFAULT_HANDLERS[Event.STARTED] = dependency_done
_DEFAULT_HANDLERS[Event.COMPLETED] = dependency_done
_DEFAULT_HANDLERS[Event.ERROR] = dependency_failed
_DEFAULT_HANDLERS[Event.CANCELED] = dependency_failed
#: Every task's handler table unless it is given its own: one tuple shared by all (a list per task
#: costed an allocation, and garbage-collector work, per task built). A task that needs other
#: handlers assigns a table of its own: ``task.handlers = [*task.handlers]`` then changes it.
DEFAULT_HANDLERS = tuple(_DEFAULT_HANDLERS)

TaskOrTasks = Union["Task", Iterable["Task"], None]


class Task(EventManager):
    """A unit of work with dependencies, a priority and a size in bytes.

    Args:
        name: shown in errors, traces and ``repr``.
        priority: lower is more urgent; ``None`` inherits the enclosing schedule's (or 0).
        nbytes: bytes this task moves; it takes that much credit while in progress (see
            :attr:`takes_credit`) and decides whether the engine partitions it.
        timeout: seconds from post after which the task fails with :class:`pycoll.TimeoutError`.

    Owned by the engine (public so that the engine, schedules and tracers use them without a call
    per task; read them freely; only the engine, schedules and the task's own reset write them):

    * ``effective_priority``: the priority the task is queued with: its own ``priority``, else its
      schedule's (set when it is submitted or its schedule starts);
    * ``pending``: what it waits for before it may be queued: its unfinished dependencies (a
      pipeline adds its fragment-ordering waits), plus 1 until it is activated (submitted, or its
      schedule started);
    * ``ctx``: the :class:`~pycoll.engine.context.Context` that activated it;
    * ``held_credit``: bytes of credit it holds now (taken when it starts, given back when it ends);
    * ``parent``: the schedule it was added to (set by :meth:`Schedule.add <pycoll.tasks.Schedule.add>`);
      a task that finishes calls ``parent.child_finished(self)`` after notifying its listeners;
    * ``n_deps``: how many dependencies it has (``depends_on`` calls);
    * ``parts``: the schedule of its fragments when the engine partitioned it;
    * ``t_ready``: when it was queued (``time.monotonic()``; only while a context traces, else 0);
      the context's ``on_start`` hook may consume it (set it to 0);
    * ``t_start``: when it started (only for tasks with a timeout: its deadline's stamp).
    """

    __slots__ = ("name", "priority", "nbytes", "credit", "timeout", "state", "error", "result",
                 "pending", "_deps", "n_deps", "ctx", "effective_priority", "held_credit", "parent", "parts",
                 "t_ready", "t_start", "__dict__")

    #: What the task does when a task it subscribed to (without a handler) publishes an event, by
    #: event (see :mod:`pycoll.events`): the shared :data:`DEFAULT_HANDLERS` unless it assigns its own.
    handlers: Sequence[Any] = DEFAULT_HANDLERS
    #: Who built the task as a whole collective (a team's planner), or None: what a revoked team
    #: fails in the engine (see :meth:`Context.fail_owned <pycoll.engine.context.Context.fail_owned>`).
    owner: Any = None
    #: The :class:`~pycoll.tl.base.Mark` its collective's messages carry (set by the planner that
    #: built it, which stamps it for each call; None: unmarked).
    mark: Any = None
    #: Whether a new task of this kind takes ``nbytes`` of credit (``task.credit``) while in
    #: progress. The unit of credit is a unit of communication: a collective (or one partition of
    #: it) takes credit as a whole, so the sends, receives and reductions inside it take none.
    takes_credit = True
    #: Whether the engine calls :meth:`progress` while the task is in progress. Tasks completed by
    #: events (schedules) set it False.
    polled = True

    def __init__(self, name: Optional[str] = None, *, priority: Optional[int] = None, nbytes: int = 0,
                 timeout: Optional[float] = None) -> None:
        EventManager.__init__(self)
        self.name = name if name is not None else type(self).__name__
        self.priority = priority
        self.nbytes = nbytes
        #: Bytes of credit the task holds while in progress (0: it is never held back by credit).
        self.credit = nbytes if self.takes_credit else 0
        self.timeout = timeout
        self.state = NOT_READY
        self.error: Optional[BaseException] = None
        self.result: Any = None
        self.pending = 1  # unfinished dependencies + 1 until the task is activated
        # the tasks it depends on: None, the one task, or a list of them (most tasks have at most
        # one: no list to allocate and for the garbage collector to walk)
        self._deps: Union[None, Task, List[Task]] = None
        self.n_deps = 0
        self.ctx: Optional[Context] = None
        self.effective_priority = 0
        self.held_credit = 0
        self.parent: Optional[Task] = None
        self.parts: Optional[Task] = None
        self.t_ready = 0.0
        self.t_start = 0.0

    # ----------------------------------------------------------------------------- to override
    def post(self) -> None:
        """Start the work. Called once by the engine when the task starts. The default completes
        at once (a no-op task, useful as a join point)."""
        self.complete()

    def progress(self) -> None:
        """Advance the work; call :meth:`complete` when done. Called by the engine while the task
        is in progress (if :attr:`polled`). Raising an exception fails the task."""

    def on_cancel(self) -> None:
        """Release what :meth:`post` started (outstanding transfers) when an in-progress task is
        canceled or fails."""

    #: Bytes of scratch the task keeps between runs (what the plan pool counts besides
    #: ``nbytes``); tasks that keep scratch say how much.
    scratch_bytes = 0

    def finalize(self) -> None:
        """Release the task's resources for good (it will not be posted again): by default what
        :meth:`unbind` drops. Tasks that own scratch drop it too: a dropped task is often part of
        a reference cycle (a schedule and its children), which only the garbage collector frees,
        long after the memory it holds should have gone."""
        self.unbind()

    def unbind(self) -> None:
        """Drop the references this finished task holds to its call's buffers: it waits in the
        plan pool until a call rebinds it, and the caller's memory (an array, a tensor) must not
        live on for it. Tasks that keep buffers override this."""

    def split(self, max_bytes: int) -> Optional[List[Task]]:
        """Return fragments of at most ``max_bytes`` that together do this task's work, or
        ``None`` if the task cannot be partitioned. The engine calls it for tasks larger than the
        partition size."""
        return None

    def describe(self) -> str:
        """One line saying what the task waits on (its peer, tag, ...), for timeout errors."""
        return self.name

    # ----------------------------------------------------------------------------- dependencies
    def depends_on(self, task: Task, event: Event = Event.COMPLETED) -> None:
        """Start only after ``task`` publishes ``event`` (COMPLETED, or STARTED for ordering).

        If ``task`` fails or is canceled, this task is canceled with the same cause.
        """
        if self.state is not NOT_READY:
            raise RuntimeError(f"{self!r}: dependencies can only be added before the task starts")
        if event is _COMPLETED:
            events = _AFTER_COMPLETED
            satisfied = task.state is COMPLETED
        elif event is _STARTED:
            events = _AFTER_STARTED
            satisfied = task.state is not NOT_READY
        else:
            raise ValueError(f"a dependency waits for COMPLETED or STARTED, not {Event(event).name}")
        deps = self._deps
        if deps is None:
            self._deps = task
        elif isinstance(deps, list):
            deps.append(task)
        else:
            self._deps = [deps, task]
        self.n_deps += 1
        if not satisfied:
            self.pending += 1
        task.subscribe_mask(events, self)

    @property
    def dependencies(self) -> List[Task]:
        """The tasks this one waits for."""
        deps = self._deps
        return [] if deps is None else list(deps) if isinstance(deps, list) else [deps]

    # ----------------------------------------------------------------------------- state changes
    @property
    def done(self) -> bool:
        """True once the task completed, failed or was canceled."""
        return self.state >= COMPLETED

    def complete(self, result: Any = None) -> None:
        """Mark the task completed (from :meth:`post` or :meth:`progress`) and notify listeners."""
        if self.state is not IN_PROGRESS:
            if self.state in FINISHED:
                return
            raise RuntimeError(f"{self!r}: complete() called on a task that was never started")
        self.state = COMPLETED
        if result is not None:
            self.result = result
        if self.held_credit:
            self.ctx.release_credit(self)
        if self.listened & _COMPLETED_BIT:  # (most tasks submitted alone have no listener)
            self.notify(_COMPLETED)
        if self.parent is not None:
            self.parent.child_finished(self)

    def fail(self, error: BaseException) -> None:
        """Put the task in ERROR with ``error`` and notify listeners (dependants are canceled,
        the enclosing schedule fails with the same error)."""
        if self.state in FINISHED:
            return
        started = self.state is IN_PROGRESS
        self.state = ERROR
        self.error = error
        if started:
            self._stop()
        if self.held_credit:
            self.ctx.release_credit(self)
        self.notify(_ERROR)
        if self.parent is not None:
            self.parent.child_finished(self)

    def cancel(self, cause: Optional[BaseException] = None) -> bool:
        """Cancel the task if it has not finished; returns whether it was canceled."""
        if self.state in FINISHED:
            return False
        started = self.state is IN_PROGRESS
        self.state = CANCELED
        if cause is not None:
            self.error = cause
        if started:
            self._stop()
        if self.held_credit:
            self.ctx.release_credit(self)
        self.notify(_CANCELED)
        if self.parent is not None:
            self.parent.child_finished(self)
        return True

    def _stop(self) -> None:
        """Stop in-progress work on failure or cancel: partitions first, then the task's own."""
        if self.parts is not None:
            self.parts.cancel()
        try:
            self.on_cancel()
        except Exception:  # a failing cleanup must not hide the original error
            pass

    def reset(self) -> None:
        """Make a finished task ready to be posted again (persistent collectives, pipeline slots)."""
        if self.state is IN_PROGRESS:
            raise RuntimeError(f"{self!r}: cannot reset a task in progress")
        self.state = NOT_READY
        self.error = None
        self.result = None
        self.held_credit = 0
        self.parts = None
        self.pending = 1 + self.n_deps

    # ----------------------------------------------------------------------------- engine side
    def activate(self, ctx: Context) -> None:
        """The task was submitted to ``ctx`` or its schedule started: it stops waiting for that, and
        is queued on ``ctx`` once its dependencies are done (called by the engine and schedules)."""
        self.ctx = ctx
        self.pending -= 1
        if self.pending == 0 and self.state is NOT_READY:
            ctx.enqueue(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.state.name}>"


class FunctionTask(Task):
    """Calls ``fn(*args)`` when posted and completes with its return value (local work: a
    reduction, a copy, a callback). Takes no credit."""

    __slots__ = ("fn", "args")
    takes_credit = False

    def __init__(self, fn: Any, *args: Any, name: Optional[str] = None, priority: Optional[int] = None,
                 nbytes: int = 0, timeout: Optional[float] = None) -> None:
        super().__init__(name if name is not None else getattr(fn, "__name__", "function"),
                         priority=priority, nbytes=nbytes, timeout=timeout)
        self.fn = fn
        self.args = args

    def post(self) -> None:
        self.complete(self.fn(*self.args))


class CopyTask(Task):
    """Copies ``src`` into ``dst`` (same size, any buffer-protocol objects). It takes credit for
    its bytes and can be partitioned: the engine splits large copies into fragments."""

    __slots__ = ("dst", "src")

    def __init__(self, dst: Any, src: Any, *, name: Optional[str] = None, priority: Optional[int] = None,
                 timeout: Optional[float] = None) -> None:
        self.dst = as_bytes(dst, writable=True)
        self.src = as_bytes(src)
        if self.dst.nbytes != self.src.nbytes:
            raise ValueError(f"CopyTask: dst has {self.dst.nbytes} bytes, src {self.src.nbytes}")
        super().__init__(name or "copy", priority=priority, nbytes=self.dst.nbytes, timeout=timeout)

    def post(self) -> None:
        self.dst[:] = self.src
        self.complete()

    def split(self, max_bytes: int) -> Optional[List[Task]]:
        n = self.dst.nbytes
        return [CopyTask(self.dst[i:i + max_bytes], self.src[i:i + max_bytes],
                         name=f"{self.name}[{k}]", priority=self.priority)
                for k, i in enumerate(range(0, n, max_bytes))]
