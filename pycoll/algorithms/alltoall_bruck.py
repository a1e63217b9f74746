"""Bruck alltoall (equal blocks only), for small messages: ceil(log2 n) messages per rank instead
of n-1, each block travelling up to log2(n) times. Rank r first rotates its blocks so that
position j holds the block for rank r+j; in step k (``d = 2^k``) it packs every position with bit
k set, sends them to rank r+d and unpacks what rank r-d sent into the same positions; position j
then holds the block from rank r-j, which the final inverse rotation puts in its place."""

from __future__ import annotations

from typing import Dict, Generator, List, Optional, Tuple

import numpy as np

from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.algorithms.options import Option, options
from pycoll.ops import copy_into, put_rows, take_rows
from pycoll.tasks.task import Task

NAME = "bruck"
COLLECTIVES = ("alltoall",)
OPTIONS: Dict[str, Option] = {}


class BruckAlltoall(StepTask):
    def __init__(self, args: CollArgs, name: str) -> None:
        super().__init__(args, name)
        n, rank = args.size, args.rank
        m = args.layout[0][1] if n else 0
        if list(args.layout) != [(i * m, m) for i in range(n)] or list(args.rlayout) != list(args.layout):
            raise ValueError(f"{args.coll}: algorithm 'bruck' needs equal blocks back to back (alltoall)")
        self.m = m
        idx = np.arange(n)
        self.final = (rank - idx) % n  # dst block i is position (rank - i) % n
        # per step: (peer to, peer from, positions moved)
        self.steps: List[Tuple[int, int, np.ndarray]] = []
        dist = 1
        while dist < n:
            self.steps.append(((rank + dist) % n, (rank - dist) % n, idx[(idx & dist) != 0]))
            dist *= 2
        self._views: Optional[tuple] = None

    def _bind(self) -> tuple:
        """The 2-D views of the buffers, and per step its (peer to, peer from, positions, pack
        buffer, wire views of the pack and unpack buffers, unpack buffer); rebuilt when the
        buffers change (a task is reused for calls of the same shape)."""
        a = self.args
        n, m = a.size, self.m
        total = n * m
        most = max(len(pos) for _, _, pos in self.steps) * m
        sendbuf = self.scratch(1, a.src[:most])
        recvbuf = self.scratch(2, a.src[:most])
        steps = []
        for to, frm, pos in self.steps:
            k = len(pos)
            send, recv = sendbuf[:k * m], recvbuf[:k * m]
            steps.append((to, frm, pos, send.reshape(k, m), as_wire(send), as_wire(recv), recv.reshape(k, m)))
        work = self.scratch(0, a.src[:total]).reshape(n, m)
        return (a.src, a.dst, a.src[:total].reshape(n, m), a.dst[:total].reshape(n, m), work, steps)

    def run(self) -> Generator[Waitable, None, None]:
        a = self.args
        n, rank, ch = a.size, a.rank, a.channel
        if self.m == 0:
            return
        if n == 1:
            if a.dst is not a.src:
                copy_into(a.dst, a.src)
            return
        views = self._views
        if views is None or views[0] is not a.src or views[1] is not a.dst:
            views = self._views = self._bind()
        _, _, src, dst, work, steps = views
        # rotation: position j holds the block for rank (rank + j) % n
        copy_into(work[:n - rank], src[rank:])
        copy_into(work[n - rank:], src[:rank])
        for step, (to, frm, pos, packed, send_wire, recv_wire, got) in enumerate(steps):
            take_rows(packed, work, pos)
            yield (ch.isend(send_wire, to, step), ch.irecv(recv_wire, frm, step))
            put_rows(work, pos, got)
        take_rows(dst, work, self.final)


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    return BruckAlltoall(args, name=args.name)
