"""Persistent collectives (MPI-4's ``MPI_Allreduce_init`` and friends): built once, started often.

``team.<coll>_init(...)`` checks the arguments once and returns a :class:`Persistent`; every
``start()`` runs the collective again on the same buffers (refill them between starts), reusing the
task, its schedule and its scratch buffers when the algorithm allows (``rebind``).
"""

from __future__ import annotations

from typing import Any, Hashable, Optional

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
        self._call = call
        self._tag, self._algorithm, self._options = tag, algorithm, options
        self._priority, self._timeout = priority, timeout
        self._task: Optional[Task] = None
        self.request: Optional[Request] = None

    @property
    def task(self) -> Optional[Task]:
        """The task kept between starts (None before the first start, or when the algorithm's
        tasks cannot be rebound and each start builds a new one)."""
        return self._task

    def start(self) -> Request:
        """Run the collective once more (collective: every rank starts it).

        The short path: the task kept from the last run completed; the planner rebinds it (a new
        message key, the same buffers) and submits it again."""
        planner, call, tag = self.planner, self._call, self._tag
        task = self._task
        lock = planner.ctx.lock
        if task is not None and task.state is COMPLETED:
            lock.acquire()  # (not ``with``: this is the hot path)
            try:
                self.request = planner.restart(task, call, tag, self._priority, self._timeout)
            finally:
                lock.release()
            return self.request
        if self.request is not None and not self.request.done:
            raise RuntimeError(f"persistent {self.coll}: start() while the previous run is in progress")
        with lock:  # the first start, or the last run failed: build it (again)
            task, key, shape = planner.build(call, tag, self._algorithm, self._options, reuse=False)
            self._task = task if shape is not None and hasattr(task, "rebind") else None
            if shape is not None:  # one collective (not partitioned): a unit of credit
                planner.credit_unit(task, key)
            self.request = planner.submit(task, self._priority, self._timeout, call.out)
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
        if self._task is not None:
            self._task.finalize()
            self._task = None
