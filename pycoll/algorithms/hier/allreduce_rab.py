"""Hierarchical allreduce "rab" (UCC's reduce - allreduce - bcast):

1. reduce onto the node leader (the node team's rank 0), on the node's shared segment;
2. allreduce among the node leaders (the leaders team, between nodes);
3. bcast from the leader to its node.

Only the leaders' data crosses nodes, once per node instead of once per rank. Pipelined in
fragments (options ``fragment_bytes``, ``depth``): the node reduces fragment f+1 while the
leaders allreduce fragment f.
"""

from __future__ import annotations

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.hier.levels import (
    PIPELINE_OPTIONS,
    HierSchedule,
    add_average,
    check_sub_teams,
    copy_task,
    fragments,
    level_op,
    level_tag,
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
    src, dst = args.src, args.dst
    leader = node.rank == 0
    sched = HierSchedule(args)
    frags = fragments(args, opts["fragment_bytes"])
    lag = opts["depth"]
    reduces, bcasts = [], []

    def reduce(f: int) -> Task:
        lo, hi = frags[f]
        tag = level_tag(args, "node-reduce", f)
        if node.size == 1:  # alone on the node: the input is the node's sum
            task = copy_task(dst[lo:hi], src[lo:hi], f"{args.name}/copy{f}") if not args.in_place else None
            return sched.add(task) if task is not None else None
        if leader:
            task = (node.task("reduce", dst[lo:hi], None, op, 0, tag=tag) if args.in_place
                    else node.task("reduce", src[lo:hi], dst[lo:hi], op, 0, tag=tag))
        else:
            task = node.task("reduce", src[lo:hi], None, op, 0, tag=tag)
        return sched.add(task)

    def bcast(f: int) -> None:
        lo, hi = frags[f]
        after = [t for t in (reduces[f],) if t is not None]
        if leader and leaders is not None and leaders.size > 1:
            tag = level_tag(args, "leaders", f)
            after = [sched.add(leaders.task("allreduce", dst[lo:hi], None, op, tag=tag), after=after)]
        if node.size > 1:
            after = [sched.add(node.task("bcast", dst[lo:hi], 0, tag=level_tag(args, "node-bcast", f)),
                               after=after)]
        bcasts.extend(after)

    interleave(len(frags), lag, lambda f: reduces.append(reduce(f)), bcast)
    add_average(sched, args, bcasts + [t for t in reduces if t is not None])
    return sched
