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

Levels are built when the collective is first posted (untagged ones take their sub-teams'
sequence numbers in posting order, like any collective); a tagged collective tags its levels with
its own key plus the level and fragment, so those match by tag too. A finished schedule is kept
for the next call of the same shape, as any collective: :meth:`HierSchedule.rebind` points its
levels at the new call's buffers and gives them new keys in the order they were built, so a
repeated call builds nothing. Its levels and local steps therefore name their buffers as
:class:`Part` s of the call's input, output or the schedule's own scratch, not as arrays.
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, List, NamedTuple, Optional, Tuple

import numpy as np

from pycoll.algorithms.base import UNBOUND, CollArgs
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


class Part(NamedTuple):
    """Elements ``lo:hi`` of the collective's input (``"src"``), output (``"dst"``) or the
    schedule's own scratch (``"own"``, :meth:`HierSchedule.own_scratch`)."""

    buf: str
    lo: int
    hi: int


class _Level(NamedTuple):
    """A level as it was built, to rebuild its call on other buffers."""

    task: Task
    team: Any
    coll: str
    args: tuple  # the call's arguments, buffers as Parts
    kwargs: dict
    name: str  # (with the fragment, what level_tag derives the level's tag from)
    frag: int


class HierSchedule(Schedule):
    """A collective made of collectives on sub-teams. It holds no credit itself: its levels are
    each a unit of credit on their own team. Add levels with :meth:`level` and local steps with
    :meth:`local` or :meth:`copy`: then a finished schedule can be rebound to a new call's buffers
    (:meth:`rebind`) and is kept for reuse like any collective (see :attr:`rebindable`)."""

    sends_first = False

    def __init__(self, args: CollArgs) -> None:
        super().__init__(name=args.name)
        self.args = args
        self.own = np.empty(0, args.dst.dtype)
        self._levels: List[_Level] = []
        self._known = 0  # tasks added by level() and local(), whose buffers a rebind knows

    @property
    def rebindable(self) -> bool:
        """Whether this finished schedule may serve another call (:func:`pycoll.tasks.task.rebindable`):
        every task was added by :meth:`level` or :meth:`local` (a rebind knows their buffers), and no
        level is a collective of the schedule's own team (a team with no sub-team of that kind: one
        node, or one rank per node). Such a level's keys and the schedule's come from one
        sequence, which a build takes levels first and a rebind the schedule's first: ranks that
        build and ranks that rebind would take different keys for the same collective."""
        owner = self.owner
        return self._known == len(self.tasks) and all(lv.team.planner is not owner for lv in self._levels)

    def own_scratch(self, size: int) -> None:
        """Give the schedule ``size`` elements of scratch of the output's dtype (``Part("own", ..)``)."""
        self.own = np.empty(size, self.args.dst.dtype)

    def view(self, part: Any) -> Any:
        """The array a :class:`Part` names on the current call (anything else as it is)."""
        if not isinstance(part, Part):
            return part
        a = self.args
        buf = a.src if part.buf == "src" else a.dst if part.buf == "dst" else self.own
        return buf[part.lo:part.hi]

    def level(self, team: Any, coll: str, *args: Any, name: str, frag: int = 0,
              after: Optional[List[Task]] = None, **kwargs: Any) -> Task:
        """Add collective ``coll`` of sub-team ``team`` (``args`` as for the team's method of that
        name, buffers as :class:`Part` s), tagged by the level's ``name`` and fragment ``frag``
        when the collective is tagged (:func:`level_tag`), after the tasks in ``after``."""
        views = [self.view(x) for x in args]
        task = team.task(coll, *views, tag=level_tag(self.args, name, frag), **kwargs)
        self._levels.append(_Level(task, team, coll, args, kwargs, name, frag))
        self._known += 1
        return self.add(task, after=after)

    def local(self, fn: Any, *args: Any, name: str, after: Optional[List[Task]] = None) -> Task:
        """Add local work ``fn(*args)`` that finds the current call's buffers when it runs (through
        :meth:`view` or ``self.args``), so that it needs no rebinding."""
        self._known += 1
        return self.add(FunctionTask(fn, *args, name=name), after=after)

    def copy(self, dst: Part, src: Part, name: str, after: Optional[List[Task]] = None) -> Task:
        """Add a local copy of ``src`` into ``dst`` (parts of the current call's buffers)."""
        return self.local(self._copy, dst, src, name=name, after=after)

    def _copy(self, dst: Part, src: Part) -> None:
        np.copyto(self.view(dst), self.view(src))

    def rebind(self, src: np.ndarray, dst: np.ndarray, key: tuple) -> None:
        """Reuse this finished schedule for a new call of the same shape: its levels get the
        parts of the new buffers and new keys on their sub-teams, taken in the order they were
        built (the order every rank builds them in)."""
        a = self.args
        a.src, a.dst = src, dst
        a.channel.rekey(key)
        if a.tag is not None:  # a tagged collective's key: its levels' tags derive from it
            a.tag = key
        self.reset()
        for lv in self._levels:
            team = lv.team
            call = team.call(lv.coll, *[self.view(x) for x in lv.args], **lv.kwargs)
            team.planner.rekey(lv.task, call, level_tag(a, lv.name, lv.frag))

    def unbind(self) -> None:
        super().unbind()
        self.args.src = self.args.dst = UNBOUND

    def finalize(self) -> None:
        super().finalize()  # (a schedule is a reference cycle: drop what it holds now)
        self.args.src = self.args.dst = UNBOUND
        self.own = np.empty(0, self.own.dtype)

    @property
    def scratch_bytes(self) -> int:  # type: ignore[override]
        """The scratch its levels and the schedule itself keep between runs."""
        return super().scratch_bytes + self.own.nbytes


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


def add_average(sched: HierSchedule, args: CollArgs, after: List[Task]) -> None:
    """AVG: divide the sum by the team size once every level is done."""
    if args.op is ReduceOp.AVG:
        sched.local(_average, args, name=f"{args.name}/avg", after=after)


def _average(args: CollArgs) -> None:
    finish_avg(args.dst, args.size)  # (the output of the current call)
