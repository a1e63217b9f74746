"""What the hierarchical algorithms share: a schedule of collectives on sub-teams (the levels),
their tags, options and checks.

A hierarchical collective (UCC's hierarchical task) is a :class:`HierSchedule` whose tasks are
whole collectives of the sub-teams the algorithm gets in its arguments (``args.node_team``,
``args.rail_team``, ``args.leaders_team``: ``sub.task(coll, ...)``), each chosen by its own
sub-team's selection: the node level runs on the node's shared segment, the level between nodes
on the transport of the rail team (UCX, MPI or TCP). Large buffers are cut into fragments
(:func:`~pycoll.algorithms.patterns.fragment_ranges`), and fragment ``f + depth``'s node-level
step is posted after fragment ``f``'s last one (:func:`~pycoll.algorithms.patterns.interleave`),
so node work on one fragment overlaps the leaders' work on another.

Levels are built when the collective is posted (untagged ones take their sub-teams' sequence
numbers in posting order, like any collective); a tagged collective tags its levels with its own
key plus the level and fragment, so those match by tag too.
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, List, Optional, Tuple

import numpy as np

from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.options import Option
from pycoll.algorithms.patterns import fragment_elems, fragment_ranges
from pycoll.ops import ReduceOp, finish_avg
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import FunctionTask, Task

#: Fragment size of the pipelined hierarchical collectives (option ``fragment_bytes``).
FRAGMENT_BYTES = 4 << 20
#: Fragments whose node-level steps may run ahead of the leaders (option ``depth``).
DEPTH = 2
#: The options of the pipelined hierarchical algorithms (allreduce rab and split_rail, bcast hier).
PIPELINE_OPTIONS: Dict[str, Option] = {
    "fragment_bytes": Option(FRAGMENT_BYTES, "bytes of one pipeline fragment: the levels run fragment "
                                             "by fragment"),
    "depth": Option(DEPTH, "fragments whose node-level step may run ahead of the leaders' level"),
}


def check_sub_teams(args: CollArgs) -> None:
    """ValueError unless the caller gave the node and rail sub-teams (a team split into nodes)."""
    if args.node_team is None or args.rail_team is None:
        algorithm = args.name.split("@")[0] or args.coll
        raise ValueError(f"{algorithm}: a hierarchical algorithm needs a team split into nodes "
                         "(node and rail sub-teams); this one has none")


class HierSchedule(Schedule):
    """A collective made of collectives on sub-teams. It holds no credit itself: its levels are
    each a unit of credit on their own team."""

    sends_first = False

    def __init__(self, args: CollArgs) -> None:
        super().__init__(name=args.name)
        self.args = args


def fragments(args: CollArgs, fragment_bytes: int) -> List[Tuple[int, int]]:
    """``(lo, hi)`` element ranges of the fragments of ``args.dst`` (one when it is small)."""
    return fragment_ranges(args.dst.size, fragment_elems(fragment_bytes, args.dst.itemsize))


def level_tag(args: CollArgs, level: str, frag: int) -> Optional[Hashable]:
    """The tag of one level's collective of fragment ``frag``: None for an untagged collective
    (matched by posting order on the sub-team), else derived from the collective's own key."""
    return None if args.tag is None else (args.tag, level, frag)


def level_op(op: ReduceOp) -> ReduceOp:
    """The op of the levels: AVG sums, and the whole collective divides once at the end."""
    return ReduceOp.SUM if op is ReduceOp.AVG else op


def add_average(sched: Schedule, args: CollArgs, after: List[Task]) -> None:
    """AVG: divide the sum by the team size once every level is done."""
    if args.op is ReduceOp.AVG:
        sched.add(FunctionTask(finish_avg, args.dst, args.size, name=f"{args.name}/avg"), after=after)


def copy_task(dst: Any, src: Any, name: str) -> Task:
    """A local copy (out-of-place input into the output) as a task."""
    return FunctionTask(np.copyto, dst, src, name=name)
