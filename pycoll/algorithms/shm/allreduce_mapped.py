"""Allreduce of arrays every rank maps (made by ``team.alloc``; native, ``native/shm.c``).

Rank i owns 1/n of the elements: it reduces them in rank order straight out of every rank's
input, a cache-sized block at a time, and writes each block into every rank's output. Per rank
that is one read of M bytes and one write of M bytes, a copy's worth of memory traffic, where the
``shm`` form copies through the segment's slots ((5 - 1/n) M). No rank reads or writes another's
share, so in place needs no barrier between the reduction and the writes: one generation on the
segment carries the ranks' offsets, and every rank returns once all have written their share.

Chosen by the planner, not by the selection table: whenever an untagged allreduce's buffers lie in
one region of the team (the segment form otherwise).
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.shm import segment_of
from pycoll.algorithms.shm.allreduce_shm import ShmAllreduce
from pycoll.tasks.task import Task

NAME = "mapped"
SEGMENT = True  # offsets published in the segment: untagged calls only
COLLECTIVES = ("allreduce",)
OPTIONS: Dict[str, Option] = {}
KIND = 13  # PC_COLL_ALLREDUCE_MAPPED (segment.COLL_ALLREDUCE_MAPPED)


def regions_of(args: CollArgs, src: np.ndarray, dst: np.ndarray) -> tuple:
    """The team's regions holding the buffers; ValueError (before anything is sent) otherwise."""
    regions = args.shared.regions_of(src, dst)
    if regions is None:
        raise ValueError(f"{args.coll}: algorithm 'mapped' needs contiguous buffers made by team.alloc")
    return regions


class MappedAllreduce(ShmAllreduce):
    def __init__(self, args: CollArgs, kind: int, name: str) -> None:
        regions = regions_of(args, args.src, args.dst)  # (before the segment hands out a ticket)
        super().__init__(args, kind, name)
        self.regions = regions
        self.seg.bind_regions(self.native, regions)

    def rebind(self, src: np.ndarray, dst: np.ndarray, key: tuple) -> None:
        regions = regions_of(self.args, src, dst)
        if regions != self.regions:
            self.regions = regions
            self.seg.bind_regions(self.native, regions)
        super().rebind(src, dst, key)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    segment_of(args)
    return MappedAllreduce(args, KIND, args.name)
