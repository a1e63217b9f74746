"""Shared-memory barrier: every rank publishes the barrier's generation and waits for all."""

from __future__ import annotations

from pycoll.algorithms.base import CollArgs, SegmentTask
from pycoll.tasks.task import Task

KIND = 2  # PC_COLL_BARRIER


class ShmBarrier(SegmentTask):
    def codes(self) -> tuple:
        return 0, 4


def build(args: CollArgs) -> Task:
    if args.shared is None:
        raise ValueError("barrier algorithm 'shm' needs a team whose ranks share a host")
    return ShmBarrier(args, KIND, args.name)
