"""A DDP communication hook that schedules gradient buckets by layer priority (ByteScheduler's idea).

DDP fills its buckets in reverse parameter order: bucket 0 holds the last layers, whose gradients
are ready first, and the highest-numbered bucket holds the first layers, which the next forward
pass needs first. :func:`priority_hook` submits each bucket to pycoll's engine with priority
``-index`` (lower runs first), so a bucket nearer the input overtakes the ones queued before it. The
engine splits each bucket into parts of ``partition_bytes`` (each part inherits the priority) and
starts parts only while the bytes in flight stay under ``credit_bytes``: a large bucket no longer
blocks an urgent one behind it.

Under a credit limit buckets are tagged collectives (tag ``("ddp-bucket", index)``), matched
across ranks by tag, so the engine may start them in any order on any transport: untagged
collectives on a host's shared segment run in posting order, tagged ones use the point-to-point
algorithms (over the segment's single-copy transport on one host). Without a credit limit nothing
is ever held back, so priority cannot reorder anything: buckets then go untagged, in DDP's order
(the same on every rank), and take the shared segment's faster collectives.

Usage::

    from pycoll.torch import PriorityHookState, priority_hook
    model = DDP(model)
    model.register_comm_hook(PriorityHookState(partition_bytes=1 << 20, credit_bytes=4 << 20), priority_hook)
"""

from typing import Any, Optional

import torch
import torch.distributed as dist

from pycoll.config import parse_bytes
from pycoll.torch.backend import ProcessGroupPycoll


class PriorityHookState:
    """State of :func:`priority_hook`.

    Args:
        process_group: the ``pycoll`` process group (default: the default group).
        partition_bytes: split buckets into parts of at most this many bytes (None: keep the
            engine's setting, ``PYCOLL_PARTITION_BYTES``). Must be equal on every rank.
        credit_bytes: most bytes in flight (None: keep ``PYCOLL_CREDIT_BYTES``).
        average: divide the summed gradients by the group size, as DDP's default hook does.

    ``partition_bytes`` and ``credit_bytes`` are settings of the process's engine, applied when the
    hook first runs: credit is one budget for all of a process's communication (as
    ByteScheduler's), so they hold for every collective of the process from then on, not only
    for the buckets.
    """

    def __init__(self, process_group: Any = None, partition_bytes: Any = None, credit_bytes: Any = None,
                 average: bool = True) -> None:
        self.process_group = process_group
        self.partition_bytes = None if partition_bytes is None else parse_bytes(str(partition_bytes))
        self.credit_bytes = None if credit_bytes is None else parse_bytes(str(credit_bytes))
        self.average = average
        self.buckets_posted = 0
        self._applied = False

    def group(self) -> Any:
        pg = self.process_group or default_group()
        if not isinstance(pg, ProcessGroupPycoll):
            raise TypeError(f"priority_hook needs a process group of backend 'pycoll', got {pg!r}")
        if not self._applied:
            self._applied = True
            if self.partition_bytes is not None:
                pg.ctx.partition_bytes = self.partition_bytes
            if self.credit_bytes is not None:
                pg.ctx.credit_bytes = self.credit_bytes
        return pg


def default_group() -> Any:
    """torch's default process group (``torch.distributed.group.WORLD``); a ValueError if
    ``init_process_group`` was not called, as torch's own lookup raises."""
    if not dist.is_initialized():
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    return dist.group.WORLD


def bucket_priority(index: int) -> int:
    """The engine priority of DDP bucket ``index`` (lower runs first; the highest index holds the
    layers nearest the input)."""
    return -index


# DDP checks these annotations as objects: no ``from __future__ import annotations`` in this module.
def priority_hook(state: Optional[PriorityHookState],
                  bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Allreduce ``bucket`` through pycoll with priority by its position; a DDP comm hook."""
    if state is None:
        state = PriorityHookState()
    pg = state.group()
    buf = bucket.buffer()
    index = bucket.index()
    tag = ("ddp-bucket", index) if pg.ctx.credit_bytes else None
    work = pg.allreduce_scheduled(buf, priority=bucket_priority(index), tag=tag)
    state.buckets_posted += 1
    if not state.average:
        return work.get_future().then(lambda fut: fut.value()[0])
    size = pg.team.size
    return work.get_future().then(lambda fut: fut.value()[0].div_(size))
