"""The planner: from a checked call to a task submitted to the engine.

One :class:`Planner` per team. For each collective call it selects the algorithm (``PYCOLL_TUNE``
and the default rules, cached per call shape), takes the message key (by posting order, or by user
tag), reuses a finished task of the same shape or builds one (:mod:`pycoll.algorithms`), cuts a
large allreduce into parts when ``PYCOLL_PARTITION_BYTES`` asks, makes each collective (or part) a
unit of credit, and submits it to the team's progress engine. Finished tasks come back to a pool
per shape when their request is collected: the next call of that shape rebinds one to its buffers
(the cost of a small collective is mostly building it).
"""

from __future__ import annotations

import itertools
import math
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Hashable, List, Optional, Set, Tuple, Union

import numpy as np

from pycoll import agreement, algorithms, config, status
from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.tuning import HIERARCHICAL
from pycoll.buffers import aliasing
from pycoll.calls import REJECTION, Call, block_layout
from pycoll.collectives import COLLECTIVES
from pycoll.dtypes import element_code
from pycoll.engine.express import ExpressLane, ProgramLane
from pycoll.engine.request import Request
from pycoll.errors import ClosedError, MismatchError, PycollError, RevokedError
from pycoll.lower.record import NotLowerable, record, runs_native
from pycoll.ops import ReduceOp
from pycoll.persistent import RecentCalls
from pycoll.tasks.keys import key_of
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import COMPLETED, FINISHED, Task, rebindable

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.team import Team

#: Finished collectives kept per call shape for reuse, and shapes remembered per team.
MAX_PLANS_PER_SHAPE = 4
MAX_PLAN_SHAPES = 64
#: Most bytes the kept collectives of a team may hold (:func:`held_bytes`: the scratch they keep,
#: and their callers' buffers where they stay bound): a program of many large sizes keeps fewer of
#: them instead of more memory.
#: (Measured: at 16 MiB, and 32 MiB of remembered calls, 10,000 random calls grew RSS 13-21% past
#: the first thousand.) A collective that alone holds more is kept outside the pool while its
#: call repeats (:meth:`Planner._keep_large`): its scratch, mapped anew, would cost page faults.
MAX_PLAN_BYTES = 8 << 20
#: A kept collective of at least this many bytes lets go of its call's buffers (``Task.unbind``):
#: the caller's memory is freed when the caller drops it. Smaller ones stay bound, so that the next
#: call on the same buffers (a training loop's) skips pointing the task at them again.
UNBIND_BYTES = 64 << 10
#: The v-collective shapes (layouts) remembered as built once, and the programs recorded (by
#: shape): the next build of one makes its native program (see :meth:`Planner.native`);
#: forgotten all at once past this many.
MAX_LAYOUTS_SEEN = 4096
_UNRECORDED = object()


def _remember(seen: Set[tuple], shape: tuple) -> None:
    """Add ``shape`` to ``seen``, forgetting all once it holds :data:`MAX_LAYOUTS_SEEN`."""
    if len(seen) >= MAX_LAYOUTS_SEEN:
        seen.clear()
    seen.add(shape)


def held_bytes(task: Task) -> int:
    """The memory a finished collective kept for reuse holds: its scratch, and its caller's buffers
    only when they are smaller than :data:`UNBIND_BYTES` (larger ones it lets go when kept)."""
    nbytes = task.nbytes
    return task.scratch_bytes + (nbytes if nbytes < UNBIND_BYTES else 0)


_INF = math.inf  # (a timeout of inf, 0 or less: none)
_get_ident = threading.get_ident
_UNKEYED = ("unkeyed",)  # the key of a task being built, replaced before it runs
def uncredit(task: Task, inside_only: bool = False) -> None:
    """Take away the credit of ``task`` (unless ``inside_only``) and of every task inside it, if it
    is a schedule: a collective that takes none, or the tasks of one that holds it whole."""
    if not inside_only:
        task.credit = 0
    if isinstance(task, Schedule):
        for sub in task.tasks:
            uncredit(sub)


class Planner:
    """Selection, message keys, the plan cache, credit and partitioning of one team's collectives."""

    def __init__(self, team: Team) -> None:
        self.team = team
        self.ctx = team.ctx  # a team's engine never changes
        self._seq = itertools.count()
        self._tag_uses: Dict[Hashable, int] = {}
        self._plans: Dict[tuple, List[Task]] = {}
        self._plan_bytes = 0  # what the kept collectives hold (held_bytes; MAX_PLAN_BYTES)
        self._large: Optional[Tuple[tuple, Task]] = None  # (shape, task): see _keep_large
        self._large_seen: Optional[tuple] = None  # the shape of the last large collective finished
        self._selected: Dict[tuple, str] = {}  # (coll, bytes, untagged) -> default algorithm
        self._check: str = config.get("PYCOLL_CHECK")  # which calls the agreement check runs for
        #: The marks of the team's collectives and their history (:class:`pycoll.agreement.Marks`).
        self.marks = agreement.Marks(self, self._check)
        #: ``[ident]`` of the thread that posts the team's untagged collectives now (see
        #: :meth:`pycoll.agreement.Marks.posting`; the express lanes read it too).
        self.poster = self.marks.poster
        self._native_programs: bool = config.get("PYCOLL_NATIVE_PROGRAMS")
        self._layouts_seen: Set[tuple] = set()  # the v-collective shapes built once (see native)
        self._recorded: Dict[tuple, Any] = {}  # shape -> its program (None: not lowerable; native)
        self._exchange: Optional[Any] = None  # the agreement check's exchange, lowered (native_check)
        self._recycle_done = self.recycle  # one bound method for every request
        #: The calls remembered for their repeats, by collective and first argument.
        self.recent = RecentCalls()
        #: Why the team takes no more calls, or None: revoked (a
        #: :class:`~pycoll.errors.RevokedError`) or closed (:class:`~pycoll.errors.ClosedError`).
        #: Every call raises an error of its type (:meth:`refuse`) before anything is sent.
        self.revoked: Optional[PycollError] = None
        #: Where a timed-out collective asks its peers what they do (:mod:`pycoll.status`), or None.
        self.peer_status: Optional[Union[status.MPIStatus, status.StoreStatus]] = None

    # ------------------------------------------------------------------ message keys
    def posted(self) -> int:
        """How many untagged collectives this rank has posted on the team (the next one's number)."""
        return int(repr(self._seq)[6:-1])  # "count(5)": the counter itself, not a copy of it

    def tag_uses(self, tag: Hashable) -> int:
        """How many collectives this rank has posted on the team with ``tag``."""
        return self._tag_uses.get(tag, 0)

    def explain_wait(self, task: Task, waiting: List[Task]) -> str:
        """What the peers do about the collective ``task`` that timed out waiting on ``waiting``
        (asked on the team's status communicator, :mod:`pycoll.status`); empty where the team has
        none (the segment's collectives say it from the peers' signatures)."""
        if self.peer_status is None or any(getattr(t, "seg", None) is not None for t in (task, *waiting)):
            return ""  # (a collective on the segment: its text reads the peers' signatures)
        key = key_of(task, waiting)
        if key is None:
            return ""
        answers = self.peer_status.ask(key)
        text = status.explain(key, answers)
        return f"; collective {status.place(key)} of this team: {text}" if text else ""

    def next_sequence(self) -> int:
        """The sequence number of the next untagged collective (matched across ranks by order)."""
        return next(self._seq)

    def coll_key(self, tag: Optional[Hashable]) -> tuple:
        """The message key of a new collective: ``("c", seq)`` for untagged collectives (matched
        by posting order), ``("u", tag, k)`` for the k-th use of a user tag (matched by tag)."""
        if tag is None:
            return ("c", next(self._seq))
        uses = self._tag_uses.get(tag, 0)
        self._tag_uses[tag] = uses + 1
        return ("u", tag, uses)

    def rekey(self, task: Task, call: Call, tag: Optional[Hashable]) -> tuple:
        """Rebind finished ``task`` to ``call``'s buffers and ``tag``'s next key (returned), stamping
        its mark (a kept schedule's collectives on a sub-team, rebound with it)."""
        key = self.coll_key(tag)
        task.rebind(call.src, call.dst, key)
        if task.mark is not None:
            self.marks.stamp(task.mark, key, call.coll)
        return key

    # ------------------------------------------------------------------ posting
    def post(self, call: Call, priority: int, tag: Optional[Hashable], algorithm: Optional[str],
             timeout: Optional[float], options: dict) -> Request:
        """Build (or reuse) the collective's task and submit it. Everything the caller passed has
        been checked: nothing here fails after the message key is taken. Under the engine's lock:
        a progress thread may be returning finished collectives to the pool meanwhile.

        The common case is the short path: a finished task of the same shape waits in the pool;
        it is rebound to the new buffers and key and submitted, nothing built."""
        pending = self.marks.pending
        if self.revoked is not None or (pending is not None and pending()):
            self.refuse()
        if tag is None and _get_ident() != self.poster[0]:
            self.marks.posting()
        ctx = self.ctx
        lock = ctx.lock
        lock.acquire()  # (not ``with``: this is the hot path of every collective)
        try:
            shape = self.shape(call, tag, algorithm, options)
            task = self._kept(shape)
            if task is not None:
                key = ("c", next(self._seq)) if tag is None else self.coll_key(tag)
                task.rebind(call.src, call.dst, key)
                mark = task.mark
                if mark is not None:
                    self.marks.stamp(mark, key, call.coll)
                if task.credit and ctx.credit_bytes:  # its credit was set when it was built
                    ctx.watch_demand(task, self.team.transport, key)
            else:
                task, key, shape = self.build(call, tag, algorithm, options, reuse=False)
                if shape is None:  # partitioned: a schedule of parts, each its own unit of credit
                    return self.submit(self.checked(task, call, key), priority, timeout, call.out,
                                       on_done=self.let_go)
                self.credit_unit(task, key)
            if call.coll in self.marks.exchanged:  # (checked(), whose test this is, inline)
                guarded = self.checked(task, call, key)
                if guarded is not task:  # behind the agreement check: pooled when the check is over
                    task.plan_shape = shape
                    return self.submit(guarded, priority, timeout, call.out, on_done=self.recycle_checked)
            t = ctx.timeout if timeout is None else timeout
            task.timeout = t if t is not None and 0 < t < _INF else None
            task.plan_shape = shape
            return ctx.submit(task, priority, call.out, self._recycle_done)
        finally:
            lock.release()

    # ------------------------------------------------------------------ the express lane
    def express_lane(self, task: Task, result: Any, owner: Any) -> Union[ExpressLane, ProgramLane]:
        """The express lane of the ``task`` of a persistent (or repeated) collective ``owner``:
        it runs it again on the buffers of its last run while the engine is idle, taking the
        next sequence number as any untagged collective (see :class:`ExpressLane`); each run's
        request returns ``result`` and becomes ``owner.request``. A run due the agreement check
        (none is, for a program that runs its check itself: :meth:`native_check`), or that finds
        a peer's news (``marks.pending``) or the team revoked, goes through ``owner.restart_as``."""
        itself, marks, coll = getattr(task, "checks_itself", False), self.marks, owner.coll
        stamp = marks.stamper(task.mark, coll) if task.mark is not None else None
        checked = not itself and coll in marks.exchanged

        def due(k: int) -> bool:  # (called with the number of every run of the lane, as it takes it)
            if stamp is not None:
                stamp(k)
            pending = marks.pending
            return self.revoked is not None or checked or (pending is not None and pending())

        return self.ctx.express_lane(task, self._seq, result, owner, due, self.poster)

    def check_due(self, coll: str, k: int) -> bool:
        """Whether the untagged collective numbered ``k`` (or a tagged one's ``k``-th use) runs
        behind the agreement check's exchange (``PYCOLL_CHECK``, :mod:`pycoll.agreement`): on the
        collective alone, so that the ranks never disagree on it, whatever path a call takes."""
        return coll in self.marks.exchanged

    def restart(self, task: Task, call: Call, tag: Optional[Hashable], priority: int,
                timeout: Optional[float], key: Optional[tuple] = None) -> Request:
        """Run the finished task of a persistent collective again on the call's buffers: a new
        message key (``key``, when an express lane took it already), its credit, submitted (it
        stays with its persistent collective, never pooled). Under the engine's lock."""
        pending = self.marks.pending
        if self.revoked is not None or (pending is not None and pending()):
            self.refuse()
        if tag is None and _get_ident() != self.poster[0]:
            self.marks.posting()
        ctx = self.ctx
        if key is None:  # (else an express lane took it, and stamped its mark)
            key = ("c", next(self._seq)) if tag is None else self.coll_key(tag)
            if task.mark is not None:
                self.marks.stamp(task.mark, key, call.coll)
        task.rebind(call.src, call.dst, key)
        if task.credit and ctx.credit_bytes:
            ctx.watch_demand(task, self.team.transport, key)
        if call.coll in self.marks.exchanged:  # (checked(), whose test this is, inline)
            task = self.checked(task, call, key)
        t = ctx.timeout if timeout is None else timeout
        task.timeout = t if t is not None and 0 < t < _INF else None
        return ctx.submit(task, priority, call.out)

    def post_named(self, call: Call, priority: int, tag: Optional[Hashable], algorithm: Optional[str],
                   timeout: Optional[float], name: Optional[str], credit: bool) -> Request:
        """:meth:`post` for the scheduling layer: ``name`` labels the task in traces and errors;
        ``credit=False`` makes a collective that takes no credit (started by priority alone)."""
        with self.ctx.lock:
            if not credit:
                task, key, shape = self.build(call, tag, algorithm, {}, reuse=False, credit=False)
                uncredit(task)
                shape = None
            else:
                task, key, shape = self.build(call, tag, algorithm, {}, reuse=True)
                if shape is not None:
                    task = self.credit_unit(task, key)
            if name is not None:
                task.name = name
            guarded = self.checked(task, call, key)
            return self.submit(guarded, priority, timeout, call.out, shape if guarded is task else None)

    def task(self, call: Call, tag: Optional[Hashable], algorithm: Optional[str]) -> Task:
        """The collective as a task to add to a schedule (see ``Team.task``), taking no credit:
        the engine's rule that a collective a peer started starts whatever the credit keeps ranks
        from waiting on each other only between independent collectives, and a schedule's
        dependencies between collectives can chain a rank's credit to work that waits on it
        (found with tagged hierarchical allreduces under 4 KiB of credit). Priority still orders
        them."""
        with self.ctx.lock:
            task, _key, shape = self.build(call, tag, algorithm, {}, reuse=False, credit=False,
                                           checked=False)
            if shape is not None:
                uncredit(task)
        return task

    def submit(self, task: Task, priority: int, timeout: Optional[float], out: Any,
               shape: Optional[tuple] = None, on_done: Optional[Callable[[Request], None]] = None) -> Request:
        """Submit ``task`` to the team's engine with its priority and timeout (``None``: the
        context's); a task with a ``shape`` returns to the pool when its request is collected,
        else ``on_done(request)`` runs then (:meth:`let_go`, :meth:`recycle_checked`)."""
        if self.revoked is not None:
            self.refuse()
        if task.owner is None:  # (point to point, the scheduling layer's own tasks)
            task.owner = self
        ctx = self.ctx
        t = ctx.timeout if timeout is None else timeout
        task.timeout = t if t is not None and 0 < t < _INF else None
        task.priority = priority
        if shape is None:
            return ctx.submit(task, result=out, on_done=on_done)
        task.plan_shape = shape
        return ctx.submit(task, result=out, on_done=self._recycle_done)

    # ------------------------------------------------------------------ building
    def build(self, call: Call, tag: Optional[Hashable], algorithm: Optional[str], options: dict,
              reuse: bool, credit: bool = True, checked: bool = True,
              stands_for: Optional[str] = None) -> Tuple[Task, tuple, Optional[tuple]]:
        """``(task, key, shape)`` of a new collective: a finished task of the same shape rebound
        to these buffers and a new key (``reuse``), or a new one; ``shape`` is None for a
        partitioned collective (which is never reused). ``checked=False``: a collective inside a
        schedule (:meth:`task`), which the agreement check never wraps. Its mark is stamped as it
        takes its key (``stands_for``: the collective a rejection stands for, see :meth:`reject`)."""
        if self.revoked is not None:
            self.refuse()
        if tag is None and _get_ident() != self.poster[0]:
            self.marks.posting()
        coll, src, dst = call.coll, call.src, call.dst
        shape = self.shape(call, tag, algorithm, options)
        name = shape[1]
        if options and algorithm is None:  # options go to the algorithms that declare them
            options = dict(shape[-1])
        task = self._kept(shape) if reuse else None  # (its schedule and scratch, reused)
        if task is not None:
            key = ("c", next(self._seq)) if tag is None else self.coll_key(tag)
            task.rebind(src, dst, key)
            if task.mark is not None:
                self.marks.stamp(task.mark, key, coll)
            return task, key, shape
        if algorithm is None and element_code(src.dtype) is None and agreement.on_segment(coll, name):
            name = self.off_segment(coll, call.nbytes)  # (elements the segment cannot move: 32 bytes)
        build = algorithms.get(coll, name)  # raises for an unknown name before a key is used
        pb = self.ctx.partition_bytes
        if coll == "allreduce" and pb and dst.nbytes > pb and self.team.size > 1:
            sched = self.partitioned(build, call, tag, pb, name, options, credit)
            sched.plan_name = name
            sched.owner = self
            return sched, sched.key, None
        args = self.args(call, _UNKEYED, name, options)
        if tag is not None:  # the key coll_key takes next: hierarchical algorithms derive theirs from it
            args.tag = ("u", tag, self._tag_uses.get(tag, 0))
        task = build(args)  # a builder that rejects its arguments raises before a key is taken
        mark = self.marks.make(task, args.channel, call, name)
        if tag is None and self._native_programs and runs_native(coll, name):
            task = self.native(task, call, name, args, shape, checked)
            task.mark = mark
        task.plan_name = name
        task.owner = self
        key = self.coll_key(tag)
        args.channel.rekey(key)
        if mark is not None:
            self.marks.stamp(mark, key, coll if stands_for is None else stands_for)
        return task, key, shape

    def native(self, task: Task, call: Call, name: str, args: CollArgs, shape: tuple, checked: bool) -> Task:
        """``task`` as a native program where the team's transport runs them
        (``program_task``; UCX) and the engine has no credit limit; else ``task`` itself. The
        program of a shape is recorded once (a schedule's collectives are built again on every
        call of it). A v-collective's program is made for its layout: only from the second build
        of a shape (a repeated or persistent call), as recording one costs more than a small call
        of a layout seen once. ``checked``: the call goes through :meth:`checked` (a v-collective's
        program then runs its check itself, see :meth:`native_check`); not a schedule's."""
        make = getattr(self.team.transport, "program_task", None)
        if make is None or self.ctx.credit_bytes or (self.marks.on and not self.team.transport.program_marks):
            return task
        if call.layout is not None and shape not in self._layouts_seen:
            _remember(self._layouts_seen, shape)
            return task
        program = self._recorded.get(shape, _UNRECORDED)
        if program is _UNRECORDED:
            try:
                program = record(self.team, call, name, compute=False)  # (the steps are what it keeps)
            except NotLowerable:
                program = None
            if len(self._recorded) >= MAX_LAYOUTS_SEEN:
                self._recorded.clear()
            self._recorded[shape] = program
        if program is None:
            return task
        check = self.native_check(call, name) if checked else None
        native = make(args, program, self.ctx.credit_bytes, check)
        if native is None:
            return task
        native.plan_name = name
        return native

    def native_check(self, call: Call, name: str) -> Optional[tuple]:
        """``(exchange program, fingerprint, explain)``: the agreement check a native program of
        ``call`` by algorithm ``name`` runs first, for a collective whose every call is checked
        (the v-collectives; every one under ``PYCOLL_CHECK=all``), so that the check costs no
        Python; None for the others (the planner adds theirs when due, :meth:`checked`). The
        exchange is :mod:`pycoll.agreement`'s own allgather, lowered: the same messages as a
        rank that checks in Python sends."""
        n = self.team.size
        if n == 1 or not (self._check == "all" or (self._check == "auto" and call.coll in agreement.ALWAYS)):
            return None
        if self._exchange is None:
            mine, recs = np.zeros(agreement.WORDS, np.uint64), np.zeros((n, agreement.WORDS), np.uint64)
            xcall = Call("allgather", mine, recs.reshape(-1), ReduceOp.SUM, 0, None, recs.nbytes)
            self._exchange = record(self.team, xcall, agreement.EXCHANGE)
        return (self._exchange, agreement.fingerprint(call, name, self.team.rank, n),
                lambda recs: agreement.disagreement(recs, name))

    def checked(self, task: Task, call: Call, key: tuple) -> Task:
        """``task`` as it is to be submitted: behind the agreement check of :mod:`pycoll.agreement`
        when its call is due one (``PYCOLL_CHECK``; always for the v-collectives and rejections,
        see :meth:`check_due`) and runs off the shared segment."""
        if call is not REJECTION and not self.check_due(call.coll, key[1] if key[0] == "c" else key[2]):
            return task  # (a rejection is checked under every mode, at every number)
        if self.team.size == 1 or getattr(task, "checks_itself", False):  # (see native_check)
            return task
        name = getattr(task, "plan_name", None)
        if name is None or agreement.on_segment(call.coll, name):
            return task
        checked = agreement.checked_call(self, task, call, key, name)
        checked.owner = self
        return checked

    def shape(self, call: Call, tag: Optional[Hashable], algorithm: Optional[str], options: dict) -> tuple:
        """The plan-cache key of a call: what a finished task must share with it to be rebound to
        its buffers (collective, algorithm, sizes, dtype, op, in place or where ``src`` lies in
        ``dst``, root, layouts, the options it takes). (A memo by the buffers' ids costs as much.)"""
        coll, src, dst = call.coll, call.src, call.dst
        if algorithm is None:
            nbytes = call.nbytes
            name = self._selected.get((coll, nbytes, tag is None)) or self.select(coll, nbytes, tag)
            if name in ("shm", "cma") and coll == "allreduce" and self.team.shared.regions:
                if self.team.shared.regions_of(src, dst) is not None:  # (arrays of team.alloc)
                    name = "mapped"
            if options:  # options go to the algorithms that declare them
                options = algorithms.declared_options(coll, name, options)
        else:
            name = algorithm
        return (coll, name, dst.size, src.size, dst.dtype, id(call.op), aliasing(src, dst), call.root,
                call.layout, call.rlayout, tag is None, tuple(sorted(options.items())) if options else ())

    def select(self, coll: str, nbytes: int, tag: Optional[Hashable]) -> str:
        """The default algorithm of ``coll`` for ``nbytes`` on this team (cached)."""
        team = self.team
        seg = team.shared
        name = algorithms.select(coll, team.size, nbytes, shared=seg is not None and tag is None,
                                 cma=seg is not None and seg.cma, hier=team.hierarchical,
                                 cma_slow=seg is not None and seg.cma_slow,
                                 default=COLLECTIVES[coll].default if coll in COLLECTIVES else None)
        if len(self._selected) > 4096:
            self._selected.clear()
        self._selected[(coll, nbytes, tag is None)] = name
        return name

    def off_segment(self, coll: str, nbytes: int) -> str:
        """The default algorithm of ``coll`` for ``nbytes`` among those off the shared segment."""
        team = self.team
        default = COLLECTIVES[coll].default if coll in COLLECTIVES else None
        return algorithms.select(coll, team.size, nbytes, shared=False, cma=False, hier=team.hierarchical,
                                 cma_slow=False, default=default)

    def selected(self, coll: str, nbytes: int, tagged: bool = False) -> Optional[str]:
        """The algorithm the last untagged (or tagged) call of ``coll`` with ``nbytes`` selected."""
        return self._selected.get((coll, nbytes, not tagged))

    def args(self, call: Call, key: tuple, name: str, options: dict) -> CollArgs:
        """What algorithm ``name`` gets for ``call`` (keyed by message key ``key``)."""
        team = self.team
        layout, rlayout = call.layout, call.rlayout
        if layout is None:
            layout = rlayout = block_layout(call, team.size)
        hier = team.hierarchical or name in HIERARCHICAL  # a hierarchical algorithm on one node too
        return CollArgs(call.coll, team.rank, team.size, team.transport.channel(key), call.src, call.dst,
                        call.op, call.root, name=f"{call.coll}:{name}@{team.rank}", options=options,
                        shared=team.shared, layout=layout, rlayout=rlayout,
                        tag=key if key[0] == "u" else None, topology=team.topology,
                        node_team=team.node_team() if hier else None,
                        rail_team=team.rail_team() if hier else None,
                        leaders_team=team.leaders_team() if hier else None,
                        marked=self.marks.on and not agreement.on_segment(call.coll, name))

    def credit_unit(self, task: Task, key: tuple) -> Task:
        """Make ``task`` (one collective, or one part of it) a unit of credit: it holds its bytes
        while in progress, and starts whatever the credit once a peer has started it.

        Only a rank whose first move is a send takes credit: one that starts by waiting for a
        peer (a bcast or scatter receiver, a reduce or gather root) injects nothing until that
        peer's data arrives, and must not hold credit meanwhile, or two ranks could each hold the
        credit the other needs. A rank that sends first makes its peers start (their transports
        report the message), so the collective always finishes. The tasks inside a unit take no
        credit of their own (a step a custom algorithm builds from a plain ``Task`` would otherwise
        count the collective's bytes twice)."""
        task.credit = task.nbytes if getattr(task, "sends_first", True) else 0
        uncredit(task, inside_only=True)
        if task.credit and self.ctx.credit_bytes:
            self.ctx.watch_demand(task, self.team.transport, key)
        return task

    def partitioned(self, build: Any, call: Call, tag: Optional[Hashable], part_bytes: int, name: str,
                    options: dict, credit: bool = True) -> Schedule:
        """An elementwise collective as independent parts of at most ``part_bytes`` (the
        collective's key plus the part index): large work split so that urgent collectives can go
        in between. Every part is built before the key is taken (a builder that rejects its
        arguments leaves the sequence untouched); the schedule's ``key`` is the collective's."""
        src, dst = call.src, call.dst
        per = max(1, part_bytes // dst.itemsize)
        tagged = None if tag is None else ("u", tag, self._tag_uses.get(tag, 0))
        built = []
        for i, lo in enumerate(range(0, dst.size, per)):
            sl = slice(lo, lo + per)
            args = self.args(call._replace(src=src[sl], dst=dst[sl]), _UNKEYED, name, options)
            if tagged is not None:
                args.tag = (*tagged, "part", i)
            built.append((build(args), args))
        key = self.coll_key(tag)
        sched = Schedule(name=f"{call.coll}#{key[1]}/parts@{self.team.rank}")
        sched.key = key
        mark = self.marks.make(sched, args.channel, call, name)  # (the whole call's: every part carries it)
        if mark is not None:
            self.marks.stamp(mark, key, call.coll)
        for i, (task, args) in enumerate(built):
            part_key = (*key, "part", i)
            task.mark = args.channel.mark = mark
            args.channel.rekey(part_key)
            if credit:
                self.credit_unit(task, part_key)
            else:
                uncredit(task)
            sched.add(task)
        return sched

    # ------------------------------------------------------------------ the pool
    def pooled(self, shape: tuple) -> Optional[Task]:
        """A finished task kept for reuse under ``shape`` (see :meth:`recycle`), taken out of the
        pool; None if there is none. The caller rebinds it to its call."""
        pool = self._plans.get(shape)
        if not pool:
            return None
        task = pool.pop()
        self._plan_bytes -= held_bytes(task)
        return task

    def recycle(self, req: Request) -> None:
        """A collective finished and its request was collected: keep its task for reuse (the
        next call of the same shape rebinds it to its buffers and key)."""
        task = req.task
        shape = task.plan_shape
        pool = self._plans.get(shape)
        held = held_bytes(task)
        fits = self._plan_bytes + held <= MAX_PLAN_BYTES
        if pool is not None and fits and task.state is COMPLETED and len(pool) < MAX_PLANS_PER_SHAPE:
            pool.append(task)  # the common case (a pool holds tasks that can be rebound)
            self._plan_bytes += held
            if task.nbytes >= UNBIND_BYTES:
                task.unbind()
            return
        if (task.state is not COMPLETED or not rebindable(task) or held > MAX_PLAN_BYTES
                or (pool is not None and len(pool) >= MAX_PLANS_PER_SHAPE)):
            if held > MAX_PLAN_BYTES and task.state is COMPLETED and rebindable(task):
                self._keep_large(task, shape)
                return
            task.finalize()  # (not kept: nothing else is pushed out for it)
            return
        while self._plans and (len(self._plans) >= MAX_PLAN_SHAPES and pool is None
                               or self._plan_bytes + held > MAX_PLAN_BYTES):
            oldest = next(iter(self._plans))  # forget the oldest shape
            for old in self._plans.pop(oldest):
                self._plan_bytes -= held_bytes(old)
                old.finalize()
            if oldest == shape:
                pool = None
        if pool is None:
            pool = self._plans[shape] = []
        if len(pool) < MAX_PLANS_PER_SHAPE:
            pool.append(task)
            self._plan_bytes += held
            if task.nbytes >= UNBIND_BYTES:
                task.unbind()
        else:
            task.finalize()

    def _kept(self, shape: tuple) -> Optional[Task]:
        """A finished collective of ``shape`` taken out of the pool (or the large one kept outside
        it, see :meth:`_keep_large`) to be rebound, or None."""
        pool = self._plans.get(shape)
        if pool:
            task = pool.pop()
            self._plan_bytes -= held_bytes(task)
            return task
        if self._large is not None and self._large[0] == shape:
            task, self._large = self._large[1], None
            return task
        return None

    def _keep_large(self, task: Task, shape: tuple) -> None:
        """A finished collective that holds more than the whole pool may: kept alone, outside the
        pool, when the large call before it had the same shape (a loop repeating a large call then
        reuses its scratch instead of mapping and faulting it in anew: a 16 MiB allreduce by
        recursive doubling over MPI, 2 ranks, 3.4-3.6 ms a call instead of 10.7); a large call
        made once is let go at once, and the one kept goes when a large call of another shape
        finishes or the team closes."""
        if self._large is not None:
            self._large[1].finalize()
            self._large = None
        if shape == self._large_seen:
            self._large = (shape, task)
            if task.nbytes >= UNBIND_BYTES:
                task.unbind()
        else:
            task.finalize()
        self._large_seen = shape

    def recycle_checked(self, req: Request) -> None:
        """A collective run behind the agreement check (a
        :class:`~pycoll.agreement.CheckedCall`) finished: the collective it ran goes to the pool
        as an unchecked run's does (:meth:`recycle` reads only ``.task``, which the checked call
        has: the collective)."""
        self.recycle(req.task)  # type: ignore[arg-type]

    @staticmethod
    def let_go(req: Request) -> None:
        """A collective that is not kept (partitioned, or built for one run) finished: release
        its scratch now (a schedule is a reference cycle, which only the garbage collector would
        free, long after)."""
        if req.task.state in FINISHED:
            req.task.finalize()

    # ------------------------------------------------------------------ revoking
    def revoke(self, error: RevokedError) -> int:
        """The team is revoked: fail its collectives in flight with ``error`` (the number failed)
        and refuse every later one (:meth:`refuse`); the kept tasks and remembered calls go."""
        if self.revoked is None:
            self.revoked = error
        failed = self.ctx.fail_owned((self,), error)
        self.close()
        return failed

    def reject(self, what: str, error: BaseException, timeout: Optional[float] = None,
               coll: Optional[str] = None) -> BaseException:
        """Take this rank's part in collective ``what``, whose arguments failed this rank's own
        checks (``error``), so that its peers never wait for it: a barrier marked as a rejection
        (:data:`pycoll.calls.REJECTION`) in the collective's place. Returns the error to raise:
        ``error`` when every rank rejected the call (the team stays usable); when some posted it,
        a :class:`~pycoll.errors.MismatchError` that gives this rank's reason (they raise
        MismatchError too, as soon as they see this rank's mark; on the shared segment, the other
        ranks of a rooted collective that check the root's call alone may return, and raise
        PeerLostError at a later call: ``PYCOLL_CHECK``); the engine's error (a timeout, a lost
        peer) if the peers never come."""
        if self.team.size == 1 or self.revoked is not None:
            return error
        # Behind the exchange where the collective itself would be (a v-collective; or everywhere
        # unmarked): the ranks that posted it meet this rank's fingerprint there. Else a marked
        # barrier on the collective's own key: its messages meet theirs, and the marks differ.
        exchanged = coll is None or not self.marks.on or self.check_due(coll, 0)
        with self.ctx.lock:
            task, key, _shape = self.build(REJECTION, None, None, {}, reuse=False,
                                           stands_for="" if exchanged else coll)
            if exchanged:
                task = self.checked(task, REJECTION, key)
            req = self.submit(task, 0, timeout, None)
        try:
            req.wait()
        except MismatchError as exc:
            why = f"{type(error).__name__}: {error}"
            err: BaseException = MismatchError(f"{what}: this rank rejected its arguments ({why}) and "
                                               f"another posted it: {exc}")
        except PycollError as exc:
            err = exc
        else:
            return error
        err.__cause__ = error
        return err

    def is_revoked(self) -> bool:
        return isinstance(self.revoked, RevokedError)  # (not merely closed)

    def refuse(self) -> None:
        """Raise why the team takes no more calls (:attr:`revoked`: a fresh error of its type) for a
        call made after it was revoked or closed."""
        why = self.revoked
        if isinstance(why, RevokedError):
            raise RevokedError(str(why), rank=why.rank)
        raise type(why)(str(why))  # type: ignore[misc]

    def close(self) -> None:
        """Release every pooled task's scratch (the team is closing, or was revoked): every later
        call raises :class:`~pycoll.errors.ClosedError` (or the revoke's error)."""
        if self.revoked is None:
            self.revoked = ClosedError(f"{self.team.name}: the team was closed (rank {self.team.rank}); "
                                       "a call after close() (or Free()) is refused")
        for task in (t for pool in self._plans.values() for t in pool):
            task.finalize()
        self._plans.clear()
        self._plan_bytes = 0
        if self._large is not None:
            self._large[1].finalize()
            self._large = None
        self.recent.clear()
