"""Hierarchical barrier "hier": fan-in in every node (a node barrier: the leader knows its node
arrived), a barrier among the node leaders, fan-out in every node (a second node barrier: no rank
leaves before its leader has passed the leaders' barrier)."""

from __future__ import annotations

from typing import Dict

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.hier.levels import HierSchedule, check_sub_teams
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
        after = [sched.level(node, "barrier", name="fan-in")]
    if leaders is not None and leaders.size > 1:
        after = [sched.level(leaders, "barrier", name="leaders", after=after)]
    if node.size > 1:
        sched.level(node, "barrier", name="fan-out", after=after)
    return sched
