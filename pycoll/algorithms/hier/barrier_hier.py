"""Hierarchical barrier "hier": fan-in in every node (a node barrier: the leader knows its node
arrived), a barrier among the node leaders, fan-out in every node (a second node barrier: no rank
leaves before its leader has passed the leaders' barrier)."""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.hier.levels import HierSchedule, check_sub_teams, level_tag
from pycoll.algorithms.options import Option, options
from pycoll.tasks.task import Task

NAME = "hier"
COLLECTIVES = ("barrier",)
OPTIONS: Dict[str, Option] = {}


def build(args: CollArgs) -> Task:
    options(args, OPTIONS)
    check_sub_teams(args)
    node, leaders = args.node_team, args.leaders_team
    sched = HierSchedule(args)
    after = []
    if node.size > 1:
        after = [sched.add(node.task("barrier", tag=level_tag(args, "fan-in", 0)))]
    if leaders is not None and leaders.size > 1:
        after = [sched.add(leaders.task("barrier", tag=level_tag(args, "leaders", 0)), after=after)]
    if node.size > 1:
        sched.add(node.task("barrier", tag=level_tag(args, "fan-out", 0)), after=after)
    return sched
