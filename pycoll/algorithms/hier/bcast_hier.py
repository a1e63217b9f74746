"""Hierarchical bcast "hier":

1. bcast in the root's node from the root (this brings the data to the node leader);
2. bcast among the node leaders from the root's node leader;
3. bcast in every other node from its leader.

Pipelined in fragments (options ``fragment_bytes``, ``depth``).
"""

from __future__ import annotations

from typing import List

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.hier.levels import (
    PIPELINE_OPTIONS,
    HierSchedule,
    check_sub_teams,
    fragments,
    level_tag,
)
from pycoll.algorithms.options import options
from pycoll.algorithms.patterns import interleave
from pycoll.tasks.task import Task

NAME = "hier"
COLLECTIVES = ("bcast",)
OPTIONS = PIPELINE_OPTIONS


def build(args: CollArgs) -> Task:
    opts = options(args, OPTIONS)
    check_sub_teams(args)
    topo = args.topology
    node, leaders = args.node_team, args.leaders_team
    root_node = topo.nodes[args.root]
    mine = topo.nodes[args.rank] == root_node
    buf = args.dst
    sched = HierSchedule(args)
    frags = fragments(args, opts["fragment_bytes"])
    lag = opts["depth"]
    firsts: List[Task] = []

    def first(f: int) -> None:
        lo, hi = frags[f]
        task = None
        if mine and node.size > 1:
            task = sched.add(node.task("bcast", buf[lo:hi], topo.local_rank(args.root),
                                       tag=level_tag(args, "root-node", f)))
        firsts.append(task)

    def rest(f: int) -> None:
        lo, hi = frags[f]
        after = [t for t in (firsts[f],) if t is not None]
        if leaders is not None and leaders.size > 1:
            tag = level_tag(args, "leaders", f)
            after = [sched.add(leaders.task("bcast", buf[lo:hi], root_node, tag=tag), after=after)]
        if not mine and node.size > 1:
            sched.add(node.task("bcast", buf[lo:hi], 0, tag=level_tag(args, "node", f)), after=after)

    interleave(len(frags), lag, first, rest)
    return sched
