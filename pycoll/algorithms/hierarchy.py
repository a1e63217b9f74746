"""What the hierarchical algorithms share: a schedule of collectives on sub-teams.

A hierarchical collective (UCC's hierarchical task) is a :class:`HierSchedule` whose tasks are
whole collectives of the team's node team and rail/leaders team (``team.task(...)``), each chosen
by its own sub-team's selection: the node level runs on the node's shared segment, the level
between nodes on the transport of the rail team (UCX, MPI or TCP). Large buffers are cut into
fragments, and fragment ``f + depth``'s node-level step is posted after fragment ``f``'s last
one, so node work on one fragment overlaps the leaders' work on another.

Levels are built when the collective is posted (untagged ones take their sub-teams' sequence
numbers in posting order, like any collective); a tagged collective tags its levels with its own
key plus the level and fragment, so those match by tag too.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, List, Optional, Tuple

import numpy as np

from pycoll.algorithms.base import CollArgs
from pycoll.ops import ReduceOp, finish_avg
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import FunctionTask, Task

#: Fragment size of the pipelined hierarchical collectives (option ``fragment_bytes``).
FRAGMENT_BYTES = 4 << 20
#: Fragments whose node-level steps may run ahead of the leaders (option ``depth``).
DEPTH = 2


class HierSchedule(Schedule):
    """A collective made of collectives on sub-teams. It holds no credit itself: its levels are
    each a unit of credit on their own team."""

    sends_first = False

    def __init__(self, args: CollArgs) -> None:
        super().__init__(name=args.name)
        self.args = args


def fragments(args: CollArgs) -> List[Tuple[int, int]]:
    """``(lo, hi)`` element ranges of the fragments of ``args.dst`` (one when it is small)."""
    count = args.dst.size
    per = max(1, int(args.options.get("fragment_bytes", FRAGMENT_BYTES)) // max(1, args.dst.itemsize))
    if count == 0:
        return [(0, 0)]
    return [(lo, min(count, lo + per)) for lo in range(0, count, per)]


def interleave(n_frags: int, lag: int, first: Callable[[int], Any], second: Callable[[int], Any]) -> None:
    """Build fragments' two node-level parts in the order the node's segment will run them on
    every rank: ``first`` of fragments 0..lag-1, then ``second(f)`` after ``first(f + lag)``,
    then the remaining seconds (so node work on one fragment overlaps the leaders' on another)."""
    for f in range(n_frags):
        first(f)
        if f >= lag:
            second(f - lag)
    for f in range(max(0, n_frags - lag), n_frags):
        second(f)


def depth(args: CollArgs) -> int:
    d = int(args.options.get("depth", DEPTH))
    if d < 1:
        raise ValueError(f"{args.coll}: depth must be >= 1, got {d}")
    return d


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
