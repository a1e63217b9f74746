"""Schedules: tasks that own a DAG of tasks (UCC's ``ucc_schedule_t``).

A :class:`Schedule` starts its tasks that have no unfinished dependencies when it is posted, counts
their completions and completes when all are done. A failure of any task fails the schedule with
that task's exception and cancels the rest. Schedules nest: a schedule is a task and can be added
to another schedule.

A schedule hears of its tasks' ends through their ``parent`` link (a finishing task calls
``parent.child_finished(task)`` after its listeners), not through a subscription: that keeps a
task of a large schedule at three garbage-collected objects, which made building the engine
benchmark's chain of 200,000 tasks about twice as fast (the subscription list, its entries and the
collector's passes over them were most of the cost).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional

from pycoll.events.manager import Event
from pycoll.tasks.task import COMPLETED, ERROR, FINISHED, IN_PROGRESS, NOT_READY, Task, TaskOrTasks

_PROGRESS = Event.PROGRESS
_PROGRESS_BIT = 1 << _PROGRESS


def child_failed(schedule: Schedule, child: Task, data: Any) -> None:
    """Handler: a task of ``schedule`` failed or was canceled; the schedule fails with its error (or
    is canceled)."""
    if schedule.state in FINISHED:
        return
    if child.error is not None:
        schedule.fail(child.error)
    else:
        schedule.cancel()


class Schedule(Task):
    """A task made of tasks.

    Args:
        tasks: tasks to add at once, each starting as soon as the schedule starts.
        name, priority, timeout: as for :class:`Task`; tasks with ``priority=None`` inherit the
            schedule's priority.
    """

    takes_credit = False
    polled = False

    def __init__(self, tasks: Iterable[Task] = (), *, name: Optional[str] = None,
                 priority: Optional[int] = None, timeout: Optional[float] = None) -> None:
        super().__init__(name, priority=priority, timeout=timeout)
        self.tasks: List[Task] = []
        self._n_done = 0
        for task in tasks:
            self.add(task)

    def add(self, task: Task, after: TaskOrTasks = None) -> Task:
        """Add ``task``, starting after the task(s) in ``after`` complete. Returns ``task``."""
        if self.state is not NOT_READY:
            raise RuntimeError(f"{self!r}: tasks can only be added before the schedule starts")
        if task.parent is not None:
            raise ValueError(f"{task!r} already belongs to {task.parent!r}")
        if after is not None:
            if isinstance(after, Task):
                task.depends_on(after)
            else:
                for dep in after:
                    task.depends_on(dep)
        task.parent = self
        self.tasks.append(task)
        self.nbytes += task.nbytes
        return task

    def post(self) -> None:
        """Start every task whose dependencies are done (the others follow as they complete)."""
        self._n_done = 0
        tasks = self.tasks
        if not tasks:
            self._all_done()
            return
        ctx = self.ctx
        prio = self.effective_priority
        for task in tasks:
            if task.priority is None:
                task.effective_priority = prio
            else:
                task.effective_priority = task.priority
        for task in tasks:
            if self.state is not IN_PROGRESS:  # a task failed at once and stopped the schedule
                break
            task.activate(ctx)

    def child_finished(self, child: Task) -> None:
        """One of its tasks completed, failed or was canceled (the task calls it through its
        ``parent`` link, after its own listeners): the schedule completes with the last and
        publishes PROGRESS for the others; it fails with the first failure."""
        if child.state is not COMPLETED:
            child_failed(self, child, None)
            return
        self._n_done += 1
        if self._n_done == len(self.tasks):
            if self.state is IN_PROGRESS:
                self._all_done()
        elif self.listened & _PROGRESS_BIT:
            self.notify(_PROGRESS, child)

    def _all_done(self) -> None:
        """Every task completed (a hook for subclasses that do more before completing)."""
        self.complete()

    def on_cancel(self) -> None:
        """Cancel every unfinished task (on failure, cancel or timeout of the schedule)."""
        for task in self.tasks:
            if task.state not in FINISHED:
                task.cancel(cause=self.error)

    def reset(self) -> None:
        super().reset()
        self._n_done = 0
        for task in self.tasks:
            task.reset()

    def finalize(self) -> None:
        for task in self.tasks:
            task.finalize()

    @property
    def scratch_bytes(self) -> int:  # type: ignore[override]
        """The scratch its tasks keep between runs."""
        return sum(task.scratch_bytes for task in self.tasks)

    def unbind(self) -> None:
        for task in self.tasks:
            task.unbind()

    def waiting_on(self) -> List[Task]:
        """The unfinished leaf tasks in progress (or, if none, the unfinished ones not started)."""
        running: List[Task] = []
        queued: List[Task] = []
        for task in self.tasks:
            if isinstance(task, Schedule):
                inner = task.waiting_on()
                (running if task.state is IN_PROGRESS else queued).extend(inner)
            elif task.state is IN_PROGRESS:
                running.append(task)
            elif task.state is NOT_READY:
                queued.append(task)
        return running or queued

    def describe(self) -> str:
        done = sum(1 for t in self.tasks if t.state is COMPLETED)
        return f"{self.name} ({done}/{len(self.tasks)} tasks done)"

    @property
    def failed_task(self) -> Optional[Task]:
        """The first task that failed, if any."""
        for task in self.tasks:
            if task.state is ERROR:
                return task.failed_task if isinstance(task, Schedule) and task.failed_task else task
        return None
