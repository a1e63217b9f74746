"""Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k;
after ceil(log2 n) rounds every rank has heard, directly or not, from every other."""

from __future__ import annotations

from typing import Dict, Generator

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable
from pycoll.algorithms.options import Option, options
from pycoll.tasks.task import Task

NAME = "dissemination"
COLLECTIVES = ("barrier",)
OPTIONS: Dict[str, Option] = {}


class DisseminationBarrier(StepTask):
    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch = a.size, a.rank, a.channel
        token = np.zeros(1, np.uint8)
        sink = self.scratch(0, token)
        dist, step = 1, 0
        while dist < n:
            yield (ch.isend(token, (rank + dist) % n, step), ch.irecv(sink, (rank - dist) % n, step))
            dist *= 2
            step += 1


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return DisseminationBarrier(args, name=args.name)
