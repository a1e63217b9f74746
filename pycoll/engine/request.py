"""Requests: the handle a non-blocking call returns (``test``/``wait``, as in MPI)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Optional

from pycoll.errors import CanceledError
from pycoll.tasks.task import CANCELED, COMPLETED, ERROR, FINISHED, Task, TaskState

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.engine.context import Context


class Request:
    """A submitted task (usually a collective's schedule).

    ``wait()`` returns the result (the output buffer for collectives) or raises the task's error;
    ``test()`` makes one pass of the engine and says whether the task finished. Once finished,
    the outcome is kept in the request (the task may be reused by a later call).

    A request made for a task that already finished (a small collective often completes inside
    ``submit``) takes the outcome at once, so that ``wait()`` only returns what was kept;
    ``on_done`` still runs when the outcome is collected (the task stays the request's until then).
    """

    __slots__ = ("task", "ctx", "_result", "_on_done", "_final", "__weakref__")

    def __init__(self, task: Task, ctx: Context, result: Any = None,
                 on_done: Optional[Callable[[Request], None]] = None) -> None:
        self.task = task
        self.ctx = ctx
        self._result = result
        self._on_done = on_done
        state = task.state
        self._final: Optional[tuple] = (  # (state, error, result) once finished
            (state, task.error, result if result is not None else task.result)
            if state is COMPLETED or state is ERROR or state is CANCELED else None)

    @property
    def state(self) -> TaskState:
        return self._final[0] if self._final is not None else self.task.state

    @property
    def done(self) -> bool:
        """True once the task completed, failed or was canceled (no progress is made)."""
        return self._final is not None or self.task.state in FINISHED

    @property
    def error(self) -> Optional[BaseException]:
        return self._final[1] if self._final is not None else self.task.error

    @property
    def collected(self) -> bool:
        """Whether the outcome was taken (by ``wait``/``test``, or at once when the task had
        finished when the request was made): the task may run again without changing it."""
        return self._final is not None

    def test(self) -> bool:
        """Progress the engine once; True if the task finished. Raises its error if it failed."""
        if self._final is None:
            if self.task.state not in FINISHED:
                self.ctx.progress()
                if self.task.state not in FINISHED:
                    return False
        self._outcome()
        return True

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Progress until the task finishes and return its result; raise its error if it failed,
        :class:`pycoll.CanceledError` if it was canceled, and :class:`pycoll.TimeoutError` if
        ``timeout`` seconds pass first (the collective then keeps running)."""
        final = self._final
        if final is not None and final[0] is COMPLETED:  # the common case: finished inside submit
            on_done = self._on_done
            if on_done is not None:
                self._on_done = None
                on_done(self)
            return final[2]
        if final is None and self.task.state not in FINISHED:
            self.ctx.wait_for(self.task, timeout)
        return self._outcome()

    def cancel(self) -> bool:
        """Cancel the task if it has not finished."""
        if self._final is not None:
            return False
        with self.ctx.lock:
            return self.task.cancel()

    def _outcome(self) -> Any:
        final = self._final
        if final is None:
            task = self.task
            result = self._result if self._result is not None else task.result
            final = self._final = (task.state, task.error, result)
        if self._on_done is not None:
            on_done, self._on_done = self._on_done, None
            on_done(self)
        state, error, result = final
        if state is COMPLETED:
            return result
        if state is ERROR:
            raise error  # type: ignore[misc]
        if error is not None:
            raise error
        raise CanceledError(f"{self.task.name} was canceled")

    def __repr__(self) -> str:
        return f"<Request {self.task.name!r} {self.state.name}>"


class Finished:
    """What the blocking ``team.send``/``team.recv`` return: they wait for their request (raising
    its error) before they return this. Until 0.2 it stands in for the Request these calls used to
    return: reading it as one (``wait()``, ``test()``, ``task``...) still works and warns
    (DeprecationWarning: the Request is ``team.isend``/``team.irecv``'s); from 0.2 they return None."""

    __slots__ = ("_request", "_call")

    def __init__(self, request: Request, call: str) -> None:
        request.wait()
        self._request = request
        self._call = call

    def __getattr__(self, name: str) -> Any:
        warnings.warn(f"team.{self._call} blocks (as MPI_{self._call.capitalize()}) and returns None from "
                      f"pycoll 0.2: for a Request use team.i{self._call}", DeprecationWarning, stacklevel=2)
        return getattr(self._request, name)

    def __repr__(self) -> str:
        return f"<finished {self._call}>"


def wait_all(requests: Iterable[Request], timeout: Optional[float] = None) -> List[Any]:
    """Wait for every request (progressing all of them) and return their results in order."""
    reqs = list(requests)
    for req in reqs:
        if not req.done:
            req.ctx.wait_for(req.task, timeout)
    return [req.wait() for req in reqs]
