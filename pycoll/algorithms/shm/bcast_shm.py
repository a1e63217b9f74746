"""Shared-memory broadcast for a team on one host: the root copies each chunk into its slot of
the segment and every other rank copies it out (native state machine in ``native/shm.c``)."""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs, SegmentTask
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.tasks.task import Task

NAME = "shm"
COLLECTIVES = ("bcast",)
OPTIONS: Dict[str, Option] = {}
KIND = 1  # PC_COLL_BCAST
UINT8 = 4  # bytes: a broadcast does not look at the element type


class ShmBcast(SegmentTask):
    def codes(self) -> tuple:
        return 0, UINT8


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return ShmBcast(args, KIND, args.name)  # the team passes the buffer as bytes
