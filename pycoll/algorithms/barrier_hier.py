"""Hierarchical barrier "hier": fan-in in every node (a node barrier: the leader knows its node
arrived), a barrier among the node leaders, fan-out in every node (a second node barrier: no rank
leaves before its leader has passed the leaders' barrier)."""

from __future__ import annotations

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.hierarchy import HierSchedule, level_tag
from pycoll.tasks.task import Task


def build(args: CollArgs) -> Task:
    team = args.team
    node, leaders = team.node_team(), team.leaders_team()
    sched = HierSchedule(args)
    after = []
    if node.size > 1:
        after = [sched.add(node.task("barrier", tag=level_tag(args, "fan-in", 0)))]
    if leaders is not None and leaders.size > 1:
        after = [sched.add(leaders.task("barrier", tag=level_tag(args, "leaders", 0)), after=after)]
    if node.size > 1:
        sched.add(node.task("barrier", tag=level_tag(args, "fan-out", 0)), after=after)
    return sched
