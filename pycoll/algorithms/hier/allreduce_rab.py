"""Hierarchical allreduce "rab" (UCC's reduce - allreduce - bcast):

1. reduce onto the node leader (the node team's rank 0), on the node's shared segment;
2. allreduce among the node leaders (the leaders team, between nodes);
3. bcast from the leader to its node.

Only the leaders' data crosses nodes, once per node instead of once per rank. Pipelined in
fragments (options ``fragment_bytes``, ``depth``): the node reduces fragment f+1 while the
leaders allreduce fragment f.
"""

from __future__ import annotations

from typing import Optional

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.hier.levels import (
    PIPELINE_OPTIONS,
    HierSchedule,
    Part,
    add_average,
    check_sub_teams,
    fragments,
    level_op,
)
from pycoll.algorithms.options import options
from pycoll.algorithms.patterns import interleave
from pycoll.tasks.task import Task

NAME = "rab"
COLLECTIVES = ("allreduce",)
OPTIONS = PIPELINE_OPTIONS


def build(args: CollArgs) -> Task:
    opts = options(args, OPTIONS)
    check_sub_teams(args)
    node, leaders = args.node_team, args.leaders_team
    op = level_op(args.op)
    leader = node.rank == 0
    sched = HierSchedule(args)
    frags = fragments(args, opts["fragment_bytes"])
    lag = opts["depth"]
    reduces, bcasts = [], []

    def reduce(f: int) -> Optional[Task]:
        lo, hi = frags[f]
        src, dst = Part("src", lo, hi), Part("dst", lo, hi)
        if node.size == 1:  # alone on the node: the input is the node's sum
            return sched.copy(dst, src, f"{args.name}/copy{f}") if not args.in_place else None
        if leader and args.in_place:
            return sched.level(node, "reduce", dst, None, op, 0, name="node-reduce", frag=f)
        return sched.level(node, "reduce", src, dst if leader else None, op, 0, name="node-reduce", frag=f)

    def bcast(f: int) -> None:
        lo, hi = frags[f]
        dst = Part("dst", lo, hi)
        after = [t for t in (reduces[f],) if t is not None]
        if leader and leaders is not None and leaders.size > 1:
            after = [sched.level(leaders, "allreduce", dst, None, op, name="leaders", frag=f, after=after)]
        if node.size > 1:
            after = [sched.level(node, "bcast", dst, 0, name="node-bcast", frag=f, after=after)]
        bcasts.extend(after)

    interleave(len(frags), lag, lambda f: reduces.append(reduce(f)), bcast)
    add_average(sched, args, bcasts + [t for t in reduces if t is not None])
    return sched
