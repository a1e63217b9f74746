"""The express lane: a finished segment collective run again, on the same buffers, in one native
call, when the engine holds no other work.

A persistent collective's ``start()`` and a call repeated with the same argument objects (see
:mod:`pycoll.persistent`) run a task that finished before, on the buffers it is already bound to.
When the engine is idle (nothing queued, polled or watched for credit, nobody tracing) priority and
credit have nothing to order, so the run skips submission: :meth:`ExpressLane.run` checks the
engine and the team's segment, calls the segment's native ``run`` (post and advance, see
:meth:`pycoll.tl.shm.segment.ShmSegment.run`) and takes the collective's sequence number. A run that
finishes there returns one finished :class:`Request`, the same every time; one that waits for its
peers is handed to the engine (:meth:`Context.adopt`), which polls it with its deadline as any
started task. Everything the lane does is written out in that one method: it is the hot path of
every repeated small collective, and each call it saves is a tenth of a microsecond.

:class:`ProgramLane` does the same for a native program's task (a lowered collective run by C
over UCX): the program starts and is polled in one native call.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional

from pycoll.engine.request import Request
from pycoll.tasks.task import COMPLETED, IN_PROGRESS, Task

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.engine.context import Context

_get_ident = threading.get_ident


class ExpressLane:
    """The express lane of one task of a segment collective (``task.seg`` the segment,
    ``task.native`` its native state, ``task.express_started(rc)`` its slow path); made by
    :meth:`Context.express_lane <pycoll.engine.context.Context.express_lane>`."""

    __slots__ = ("ctx", "lock", "work", "task", "seg", "st", "native_run", "gen", "sequence", "result",
                 "owner", "done", "poster")

    def __init__(self, ctx: Context, work: tuple, task: Task, sequence: Iterator[int], result: Any,
                 owner: Any, poster: List[int]) -> None:
        self.ctx = ctx
        self.lock = ctx.lock
        #: The engine's containers of work (queued, polled, watched for credit): all empty when idle.
        self.work = work
        self.task = task
        self.seg = task.seg  # type: ignore[attr-defined]
        self.st = task.native  # type: ignore[attr-defined]
        self.native_run, self.gen = self.seg.express_call()
        self.sequence = sequence
        self.result = result
        #: What the task is run for (a persistent collective): its ``request``, the request of
        #: its last run, is set by every run of the lane (a run waits until it was collected).
        self.owner = owner
        #: The finished request returned by every run that finishes at once (made on the first).
        self.done: Optional[Request] = None
        #: ``[ident]`` of the thread that posts the team's untagged collectives (the planner's).
        self.poster = poster

    def run(self) -> Optional[Request]:
        """Run the task again now, if the lane is open: the request of this run, or None when it
        is closed (nothing done: submit the task as usual). Closed while the task has not
        finished its last run or its owner has not collected the outcome, while the task has
        listeners, the engine holds other work or traces, an earlier collective holds the
        segment (or it is broken), or another thread posts the team's untagged collectives."""
        task, seg, owner = self.task, self.seg, self.owner
        if _get_ident() != self.poster[0]:
            return None
        ready, free, active, demand = self.work
        lock = self.lock
        lock.acquire()  # (not ``with``: this is the hot path)
        try:
            if (ready or free or active or demand or task.state is not COMPLETED or task.listened
                    or self.ctx.on_start is not None or seg.turn != seg.tickets or seg.broken is not None):
                return None
            last = owner.request
            if last is not self.done and last is not None and not last.collected:
                return None
            rc = self.native_run(self.st, self.gen, seg.budget)
            next(self.sequence)  # the collective's number (untagged collectives match by order)
            self.ctx.posted += 1
            if rc == 1:
                if task.averages:  # type: ignore[attr-defined]
                    try:
                        task.finished()  # type: ignore[attr-defined]
                    except Exception as exc:  # the run failed after the segment part
                        task.state = IN_PROGRESS
                        task.fail(exc)
                        owner.request = req = Request(task, self.ctx, self.result)
                        return req
                done = self.done
                if done is None:
                    done = self.done = Request(task, self.ctx, self.result)
                owner.request = done
                return done
            task.express_started(rc)  # type: ignore[attr-defined]  # waits for peers, or failed
            self.ctx.adopt(task)
            owner.request = req = Request(task, self.ctx, self.result)
            return req
        finally:
            lock.release()


class ProgramLane:
    """The express lane of a task that runs itself again: a native program's task (a lowered
    collective a transport runs in C, :class:`pycoll.tl.ucx.executor.UCXProgramTask`), or a step
    task over a transport (MPI, TCP, UCX, in-process: ``StepTask.express_run`` rekeys, posts and
    advances it, skipping the planner's restart and the engine's submission). On an idle engine
    with no credit limit, a run takes the next sequence number and calls
    ``task.express_run(number)``, which starts the program and polls it in one native call (the
    step task: as far as its peers let it). One that finished there returns the same finished
    :class:`Request` every time; one that waits for its peers (or failed) is handed to the
    engine. A number that is due the agreement check (``due(number)``) goes through
    ``owner.restart_as(key)`` instead: the planner checks and submits that run."""

    __slots__ = ("ctx", "lock", "work", "task", "sequence", "result", "owner", "due", "done", "poster")

    def __init__(self, ctx: Context, work: tuple, task: Task, sequence: Iterator[int], result: Any,
                 owner: Any, due: Callable[[int], bool], poster: List[int]) -> None:
        self.ctx = ctx
        self.lock = ctx.lock
        self.work = work
        self.task = task
        self.sequence = sequence
        self.result = result
        self.owner = owner
        self.due = due
        self.done: Optional[Request] = None
        self.poster = poster

    def run(self) -> Optional[Request]:
        """Run the task again now, if the lane is open (as :meth:`ExpressLane.run`; closed too
        under a credit limit or while large collectives are partitioned)."""
        task, owner, ctx = self.task, self.owner, self.ctx
        if _get_ident() != self.poster[0]:
            return None
        ready, free, active, demand = self.work
        lock = self.lock
        lock.acquire()  # (not ``with``: this is the hot path)
        try:
            if (ready or free or active or demand or task.state is not COMPLETED or task.listened
                    or ctx.on_start is not None or ctx.credit_bytes
                    or (ctx.partition_bytes and task.nbytes > ctx.partition_bytes)):
                return None
            last = owner.request
            if last is not self.done and last is not None and not last.collected:
                return None
            number = next(self.sequence)  # the collective's number (untagged collectives match by order)
            if self.due(number):
                return owner.restart_as(("c", number))
            ctx.posted += 1
            if task.express_run(number):  # type: ignore[attr-defined]
                done = self.done
                if done is None:
                    done = self.done = Request(task, ctx, self.result)
                owner.request = done
                return done
            ctx.adopt(task)  # waits for its peers (or failed)
            owner.request = req = Request(task, ctx, self.result)
            return req
        finally:
            lock.release()


def has_express_lane(task: Optional[Task]) -> bool:
    """Whether ``task`` can run in an express lane: a segment collective that takes no credit, a
    native program's task, or a step task that runs itself again (``runs_again``)."""
    if task is None:
        return False
    return (hasattr(task, "express_started") and not task.credit) or (
        hasattr(task, "express_run") and getattr(task, "runs_again", True))


__all__ = ["ExpressLane", "ProgramLane", "has_express_lane"]
