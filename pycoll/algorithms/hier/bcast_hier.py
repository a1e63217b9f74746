"""Hierarchical bcast "hier":

1. bcast in the root's node from the root (this brings the data to the node leader);
2. bcast among the node leaders from the root's node leader;
3. bcast in every other node from its leader.

Pipelined in fragments (options ``fragment_bytes``, ``depth``).
"""

from __future__ import annotations

from typing import List, Optional

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.hier.levels import (
    PIPELINE_OPTIONS,
    HierSchedule,
    Part,
    check_sub_teams,
    fragments,
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
    sched = HierSchedule(args)
    frags = fragments(args, opts["fragment_bytes"])
    lag = opts["depth"]
    firsts: List[Optional[Task]] = []

    def first(f: int) -> None:
        lo, hi = frags[f]
        task = None
        if mine and node.size > 1:
            task = sched.level(node, "bcast", Part("dst", lo, hi), topo.local_rank(args.root),
                               name="root-node", frag=f)
        firsts.append(task)

    def rest(f: int) -> None:
        lo, hi = frags[f]
        buf = Part("dst", lo, hi)
        after = [t for t in (firsts[f],) if t is not None]
        if leaders is not None and leaders.size > 1:
            after = [sched.level(leaders, "bcast", buf, root_node, name="leaders", frag=f, after=after)]
        if not mine and node.size > 1:
            sched.level(node, "bcast", buf, 0, name="node", frag=f, after=after)

    interleave(len(frags), lag, first, rest)
    return sched
