"""Requests: the handle a non-blocking call returns (``test``/``wait``, as in MPI)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, List, Optional

from pycoll.errors import CanceledError
from pycoll.tasks.task import CANCELED, COMPLETED, ERROR, FINISHED, Task, TaskState

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.engine.context import Context


class Request:
    """A submitted task (usually a collective's schedule).

    ``wait()`` returns the result (the output buffer for collectives) or raises the task's error;
    ``test()`` makes one pass of the engine and says whether the task finished.
    """

    __slots__ = ("task", "ctx", "_result", "_on_done", "__weakref__")

    def __init__(self, task: Task, ctx: Context, result: Any = None) -> None:
        self.task = task
        self.ctx = ctx
        self._result = result
        self._on_done: Optional[Any] = None

    @property
    def state(self) -> TaskState:
        return self.task.state

    @property
    def done(self) -> bool:
        """True once the task completed, failed or was canceled (no progress is made)."""
        return self.task.state in FINISHED

    @property
    def error(self) -> Optional[BaseException]:
        return self.task.error

    def test(self) -> bool:
        """Progress the engine once; True if the task finished. Raises its error if it failed."""
        if self.task.state not in FINISHED:
            self.ctx.progress()
        if self.task.state in FINISHED:
            self._finish()
            return True
        return False

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Progress until the task finishes and return its result; raise its error if it failed,
        :class:`pycoll.CanceledError` if it was canceled, and :class:`pycoll.TimeoutError` if
        ``timeout`` seconds pass first (the collective then keeps running)."""
        if self.task.state not in FINISHED:
            self.ctx.wait_for(self.task, timeout)
        return self._finish()

    def cancel(self) -> bool:
        """Cancel the task if it has not finished."""
        with self.ctx.lock:
            return self.task.cancel()

    def _finish(self) -> Any:
        task = self.task
        if self._on_done is not None:
            on_done, self._on_done = self._on_done, None
            on_done(self)
        if task.state is COMPLETED:
            return self._result if self._result is not None else task.result
        if task.state is ERROR:
            raise task.error  # type: ignore[misc]
        if task.state is CANCELED:
            if task.error is not None:
                raise task.error
            raise CanceledError(f"{task.name} was canceled")
        raise RuntimeError(f"{task!r} is not finished")

    def __repr__(self) -> str:
        return f"<Request {self.task.name!r} {self.task.state.name}>"


def wait_all(requests: Iterable[Request], timeout: Optional[float] = None) -> List[Any]:
    """Wait for every request (progressing all of them) and return their results in order."""
    reqs = list(requests)
    for req in reqs:
        req.wait(timeout)
    return [req.wait() for req in reqs]
