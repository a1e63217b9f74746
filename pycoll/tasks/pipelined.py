"""Pipelined schedules: the same schedule run over many fragments of the data, a few at a time
(UCC's ``ucc_schedule_pipelined_t``).

``make_fragment(slot)`` builds ``depth`` fragment schedules (the slots) once; ``setup_fragment(frag,
index)`` points a slot at fragment ``index`` (offsets, counts) before each post. When a fragment
completes, its slot is reset, set up for the next fragment and posted again, so resources are
allocated once. Fragments are ordered across slots by :class:`PipelineOrder`, task by task: task
``j`` of fragment ``f + 1`` waits for task ``j`` of fragment ``f`` to start (ORDERED) or to
complete (SEQUENTIAL); with PARALLEL fragments are independent.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, List, Optional

from pycoll.events.manager import Event
from pycoll.tasks.schedule import Schedule, child_failed
from pycoll.tasks.task import COMPLETED, IN_PROGRESS, NOT_READY, Task, dependency_done

_FRAGMENT_COMPLETED = Event.FRAGMENT_COMPLETED


class PipelineOrder(enum.Enum):
    """How fragments of a pipelined schedule are ordered with respect to each other."""

    PARALLEL = "parallel"
    """Fragments in flight progress independently."""
    ORDERED = "ordered"
    """Task j of fragment f+1 starts only after task j of fragment f has started."""
    SEQUENTIAL = "sequential"
    """Task j of fragment f+1 starts only after task j of fragment f has completed."""


def _release_after_start(task: Task, source: Task, data: Any) -> None:
    source.unsubscribe(Event.STARTED, task, _release_after_start)
    dependency_done(task, source, data)


def _release_after_completion(task: Task, source: Task, data: Any) -> None:
    source.unsubscribe(Event.COMPLETED, task, _release_after_completion)
    dependency_done(task, source, data)


def _units(fragment: Task) -> List[Task]:
    return fragment.tasks if isinstance(fragment, Schedule) else [fragment]


class PipelinedSchedule(Schedule):
    """Runs ``n_fragments`` fragments with at most ``depth`` in flight.

    Args:
        n_fragments: how many fragments the work is split into (0 completes at once).
        make_fragment: ``make_fragment(slot_index) -> Task`` builds one reusable slot.
        setup_fragment: ``setup_fragment(slot_task, fragment_index)`` prepares a slot for a
            fragment before it is posted (optional).
        depth: most fragments in flight.
        order: a :class:`PipelineOrder`.

    Publishes ``Event.FRAGMENT_COMPLETED`` with the fragment's index as ``data`` after each
    fragment.
    """

    def __init__(self, n_fragments: int, make_fragment: Callable[[int], Task],
                 setup_fragment: Optional[Callable[[Task, int], None]] = None, *, depth: int = 2,
                 order: PipelineOrder = PipelineOrder.PARALLEL, name: Optional[str] = None,
                 priority: Optional[int] = None, timeout: Optional[float] = None) -> None:
        if n_fragments < 0:
            raise ValueError(f"n_fragments must be >= 0, got {n_fragments}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        super().__init__(name=name, priority=priority, timeout=timeout)
        self.n_fragments = n_fragments
        self.depth = depth
        self.order = PipelineOrder(order)
        self._make_fragment = make_fragment
        self._setup_fragment = setup_fragment
        self._next = 0  # next fragment to launch
        self._frags_done = 0
        self._slot_frag: dict = {}  # slot -> fragment index it runs
        self._last_slot: Optional[Task] = None  # slot of the most recently launched fragment
        self.fragments_launched = 0  # lifetime count, for tests and traces

    def add(self, task: Task, after: Any = None) -> Task:
        raise TypeError("a PipelinedSchedule builds its own fragments; use make_fragment")

    def _make_slots(self) -> None:
        for i in range(min(self.depth, self.n_fragments)):
            slot = self._make_fragment(i)
            if not isinstance(slot, Task):
                raise TypeError(f"make_fragment must return a Task, got {type(slot).__name__}")
            if self.order is not PipelineOrder.PARALLEL and self.tasks:
                if len(_units(slot)) != len(_units(self.tasks[0])):
                    raise ValueError("ORDERED/SEQUENTIAL pipelines need fragments with the same tasks")
            slot.parent = self  # it reports its end through child_finished
            self.tasks.append(slot)

    def post(self) -> None:
        if not self.tasks and self.n_fragments:
            self._make_slots()
        self._next = 0
        self._frags_done = 0
        self._last_slot = None
        if self.n_fragments == 0:
            self.complete()
            return
        for slot in self.tasks:
            if self.state is not IN_PROGRESS:
                break
            self._launch(slot)

    def _launch(self, slot: Task) -> None:
        frag = self._next
        self._next += 1
        if slot.state is not NOT_READY or slot.pending != 1:
            slot.reset()
        if self._setup_fragment is not None:
            self._setup_fragment(slot, frag)
        prev = self._last_slot
        if prev is not None and self.order is not PipelineOrder.PARALLEL and prev.state is not COMPLETED:
            for task, before in zip(_units(slot), _units(prev)):
                if self.order is PipelineOrder.ORDERED:
                    if before.state is NOT_READY:
                        task.pending += 1
                        before.subscribe(Event.STARTED, task, _release_after_start)
                elif before.state is not COMPLETED:
                    task.pending += 1
                    before.subscribe(Event.COMPLETED, task, _release_after_completion)
        self._slot_frag[slot] = frag
        self._last_slot = slot
        self.fragments_launched += 1
        slot.effective_priority = self.effective_priority if slot.priority is None else slot.priority
        slot.activate(self.ctx)

    def child_finished(self, slot: Task) -> None:
        """A slot finished (through its ``parent`` link): a completed fragment launches the next in
        its slot; a failed one fails the pipeline."""
        if slot.state is not COMPLETED:
            child_failed(self, slot, None)
            return
        if self.state is not IN_PROGRESS:
            return
        self._frags_done += 1
        frag = self._slot_frag[slot]
        if self.listened >> _FRAGMENT_COMPLETED & 1:
            self.notify(_FRAGMENT_COMPLETED, frag)
        if self._frags_done == self.n_fragments:
            self.complete()
        elif self._next < self.n_fragments:
            if self._last_slot is slot:
                self._last_slot = None  # the previous fragment is done: nothing to order after
            self._launch(slot)

    def reset(self) -> None:
        Task.reset(self)
        self._n_done = 0
        for slot in self.tasks:
            slot.reset()

    def describe(self) -> str:
        return f"{self.name} ({self._frags_done}/{self.n_fragments} fragments done)"
