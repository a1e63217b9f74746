"""Shared-memory barrier: every rank publishes the barrier's generation and waits for all."""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs, SegmentTask
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.tasks.task import Task

NAME = "shm"
COLLECTIVES = ("barrier",)
OPTIONS: Dict[str, Option] = {}
KIND = 2  # PC_COLL_BARRIER


class ShmBarrier(SegmentTask):
    def codes(self) -> tuple:
        return 0, 4


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmBarrier(args, KIND, args.name)
