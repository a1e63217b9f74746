"""Lowering: record what a built-in (or a user's) algorithm does on a rank as a program.

:func:`record` builds the algorithm's task for one rank (the arguments its team would give it,
on buffers of the call's shapes of its own) and runs its generator straight through on a channel
that records instead of sending: every request it yields is done at once, so the control flow
(which never depends on the data in these algorithms) goes through every step. What it records:

- each ``isend`` / ``irecv`` / ``exchange`` as send and receive instructions, on the step number
  the algorithm gave;
- each reduction through a kernel of :func:`pycoll.ops.reducer` (or ``reduce_into``), each copy
  through :func:`pycoll.ops.copy_into` and each AVG division, through :data:`pycoll.ops.observer`.

Buffers are told apart by the array that owns their memory: the call's ``src`` and ``dst``, and
any other (an algorithm's scratch, a temporary) becomes a scratch buffer of the program, its
slices located by address. Each instruction depends on the requests of the last group the
algorithm waited for and on the computations since: the order in which the generator would run.

An algorithm may compute in ways the recorder does not see (numpy calls of its own): so
:func:`pycoll.lower.verify.lower` runs the programs against the algorithm itself on the same data
on every rank of an in-process team, and the planner takes the native path only for the
algorithms in :data:`NATIVE` (each checked so by the tests) and those whose module declares
``LOWERABLE = True`` (:func:`runs_native`).

A :class:`~pycoll.tasks.Schedule` of primitive tasks (sends and receives on the collective's
channel, copies, reductions: a user's own algorithm, written as in the UCC slides) is recorded task
by task instead (:func:`lower_schedule`), each instruction depending on those of the tasks it waits
for. Other schedules (pipelined, hierarchical, tasks of Python code) and the shared segment's
native collectives are not lowered, unless the algorithm's module gives a ``lowered(args)`` form
of primitive tasks with the same messages and arithmetic (the ring allreduce's pipeline).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from pycoll import algorithms, ops
from pycoll.algorithms.base import StepTask
from pycoll.buffers import address
from pycoll.errors import PycollError
from pycoll.events.manager import Event
from pycoll.lower.program import MAX_STEP, SIZE_SLICE, Instr, Program, Sizes, Slice
from pycoll.ops import ReduceOp
from pycoll.tasks import CopyTask, RecvTask, ReduceTask, Schedule, SendTask, Task
from pycoll.tl.base import Channel, TransportRequest

#: The collectives :func:`lower` takes (a v-collective's program is made for one layout of blocks).
LOWERED = ("allreduce", "reduce", "bcast", "allgather", "reduce_scatter", "alltoall", "gather", "scatter",
           "barrier", "allgatherv", "reduce_scatterv", "alltoallv", "gatherv", "scatterv", "scan", "exscan")


#: The algorithms whose every program the tests check against the algorithm: the planner runs them
#: as native programs where the team's transport has an executor (PYCOLL_NATIVE_PROGRAMS).
NATIVE = frozenset({
    ("allreduce", "rd"), ("allreduce", "knomial"), ("allreduce", "ring"), ("reduce", "knomial"),
    ("reduce", "rs_gather"), ("bcast", "knomial"), ("bcast", "scatter_allgather"), ("allgather", "bruck"),
    ("allgather", "rd"), ("allgather", "ring"), ("reduce_scatter", "rhalving"), ("reduce_scatter", "ring"),
    ("alltoall", "pairwise"), ("alltoall", "bruck"), ("gather", "knomial"), ("gather", "linear"),
    ("scatter", "knomial"), ("scatter", "linear"), ("barrier", "dissemination"), ("allgatherv", "bruck"),
    ("allgatherv", "rd"),
    ("allgatherv", "ring"), ("reduce_scatterv", "rhalving"), ("reduce_scatterv", "ring"),
    ("alltoallv", "pairwise"), ("gatherv", "knomial"), ("gatherv", "linear"), ("scatterv", "knomial"),
    ("scatterv", "linear"), ("scan", "rd"), ("exscan", "rd")})


def runs_native(coll: str, name: str) -> bool:
    """Whether the planner may run algorithm ``name`` of ``coll`` as native programs: one of
    :data:`NATIVE`, or one whose module declares ``LOWERABLE = True`` (its builder returns a schedule
    of primitive tasks and computes nothing itself, so that its program is all it does)."""
    if (coll, name) in NATIVE:
        return True
    return getattr(algorithms.MODULES.get(coll, {}).get(name), "LOWERABLE", False) is True


class NotLowerable(PycollError):
    """The algorithm cannot be lowered to programs (it runs in Python as it is)."""


def _root(arr: np.ndarray) -> np.ndarray:
    """The array that owns ``arr``'s memory."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


def _size_of(arr: np.ndarray) -> int:
    """The bytes of ``arr``, a buffer an instruction names (contiguous, as a slice must be)."""
    if arr.size and not arr.flags.c_contiguous:
        raise NotLowerable("a buffer that is not contiguous")
    return arr.nbytes


class Recorder:
    """The instructions of one rank, and where its buffers are."""

    def __init__(self, rank: int, sizes_only: bool = False) -> None:
        self.rank = rank
        #: ``sizes_only``: each instruction's kind, peer, step and size alone are recorded, here
        #: (what the simulator reads: no buffer is looked up, no :class:`Instr` made; a program
        #: recorded so names no buffers and cannot run); else None and :attr:`instrs` hold them.
        self.sizes: Optional[Sizes] = Sizes() if sizes_only else None
        self.instrs: List[Instr] = []
        self.buffers: Dict[str, int] = {}
        self._ranges: List[Tuple[int, int, str, np.ndarray]] = []  # (start, end, name, the array: kept)
        self._group: List[int] = []  # the requests of the last group yielded
        self._since: List[int] = []  # computations since
        self._pending: List[int] = []  # requests posted since the last yield

    def name(self, arr: np.ndarray, name: str) -> None:
        """Call the memory of ``arr`` ``name`` (``dst``, ``src``: the call's own arrays, named
        first, so a slice inside one of them is named by it; then scratch buffers)."""
        start = address(arr)
        self._ranges.append((start, start + arr.nbytes, name, arr))
        self.buffers[name] = arr.nbytes

    def slice_of(self, arr: np.ndarray) -> Slice:
        if arr.size and not arr.flags.c_contiguous:
            raise NotLowerable("a buffer that is not contiguous")
        start = address(arr)
        end = start + arr.nbytes
        for lo, hi, name, _ in self._ranges:
            if lo <= start and end <= hi and (arr.nbytes or lo < hi or start == lo):
                return (name, start - lo, arr.nbytes)
        root = _root(arr)  # memory of the algorithm's own: a scratch buffer, all of its owner
        name = f"scratch{sum(1 for n in self.buffers if n.startswith('scratch'))}"
        self.name(root, name)
        return (name, start - address(root), arr.nbytes)

    def message(self, kind: str, buf: np.ndarray, peer: int, step: int) -> None:
        """Record a send or receive (``kind``) of ``buf`` with ``peer`` on ``step``: a request,
        which what follows the algorithm's next yield waits for."""
        if self.sizes is None:
            self.add(Instr(kind, {"buf": self.slice_of(buf)}, peer=peer, step=step), True)
        else:
            self._add_size(kind, peer, step, _size_of(buf), True)

    def computation(self, kind: str, arrays: Dict[str, np.ndarray], **fields: Any) -> None:
        """Record a computation (``reduce``, ``copy``, ``avg``) on ``arrays`` by slice name, with
        the instruction's other ``fields`` (op, dtype, n)."""
        if self.sizes is None:
            self.add(Instr(kind, {name: self.slice_of(a) for name, a in arrays.items()}, **fields), False)
        else:
            nbytes = 0
            for name, a in arrays.items():
                size = _size_of(a)  # (every one checked, as the full recording does)
                if name == SIZE_SLICE[kind]:
                    nbytes = size
            self._add_size(kind, -1, 0, nbytes, False)

    def add(self, ins: Instr, request: bool) -> int:
        """Add ``ins`` after what the algorithm did so far (see :meth:`waited`): its number."""
        # (every number in the group is below every one since the yield, which came after them:
        # both lists are in order, and so is the one after the other)
        ins.deps = self._group + self._since
        n = len(self.instrs)
        self.instrs.append(ins)
        (self._pending if request else self._since).append(n)
        return n

    def _add_size(self, kind: str, peer: int, step: int, nbytes: int, request: bool) -> None:
        s = self.sizes
        n = len(s.kinds)
        s.kinds.append(kind)
        s.peers.append(peer)
        s.steps.append(step)
        s.nbytes.append(nbytes)
        s.deps.append(self._group + self._since)
        (self._pending if request else self._since).append(n)

    def append(self, ins: Instr) -> int:
        """Add ``ins`` with the dependencies it has (a schedule's task, see :func:`lower_schedule`):
        its number."""
        s = self.sizes
        if s is None:
            self.instrs.append(ins)
            return len(self.instrs) - 1
        s.kinds.append(ins.kind)
        s.peers.append(ins.peer)
        s.steps.append(ins.step)
        s.nbytes.append(ins.slices[SIZE_SLICE[ins.kind]][2])
        s.deps.append(ins.deps)
        return len(s.kinds) - 1

    def waited(self) -> None:
        """The algorithm yielded: what follows waits for the requests posted so far."""
        # (the requests posted since the last yield waited for the group before: they stand for
        # it, so that a ring's steps each wait for the last, not for all before it)
        self._group = (list(self._pending) or self._group) if not self._since else list(self._pending)
        self._pending = []
        self._since = []


class _Done(TransportRequest):
    __slots__ = ()


class RecordingChannel(Channel):
    """A channel whose sends and receives are recorded and done at once."""

    def __init__(self, recorder: Recorder) -> None:  # (no transport: nothing is sent)
        self.rec = recorder
        self.key = ("c", 0)

    def rekey(self, key: tuple) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"<recording channel of rank {self.rec.rank}>"

    def _req(self, kind: str, peer: int, step: int, nbytes: int) -> TransportRequest:
        req = _Done(kind, peer, step, nbytes)
        req.done = True
        return req

    def isend(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        self.rec.message("send", buf, peer, step)
        return self._req("send", peer, step, buf.nbytes)

    def irecv(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        self.rec.message("recv", buf, peer, step)
        return self._req("recv", peer, step, buf.nbytes)

    def exchange(self, sendbuf: np.ndarray, recvbuf: np.ndarray, peer: int, step: int) -> TransportRequest:
        self.isend(sendbuf, peer, step)
        return self.irecv(recvbuf, peer, step)


class _Observer:
    """What :data:`pycoll.ops.observer` is while a rank's task is built and run: it records the
    computations into the recorder of the rank being run (and, unless ``compute``, skips them)."""

    def __init__(self, compute: bool = True) -> None:
        self.rec: Optional[Recorder] = None
        self.compute = compute
        self.thread = threading.get_ident()  # (other threads' collectives are not recorded)

    def _mine(self) -> Optional[Recorder]:
        return self.rec if threading.get_ident() == self.thread else None

    def reducer(self, op: ReduceOp, dtype: np.dtype, fn: Any) -> Any:
        if self._mine() is None:
            return fn
        name = ("sum" if op is ReduceOp.AVG else op.name.lower())
        dt = np.dtype(dtype)
        kind = str(dt)  # (the kernel's dtype, its outputs': named once, not per call)

        def recorded(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            rec = self._mine()
            if rec is not None and out.size:
                named = kind if out.dtype is dt else str(out.dtype)
                rec.computation("reduce", {"a": a, "b": b, "out": out}, op=name, dtype=named)
                if not self.compute:
                    return
            fn(a, b, out)
        return recorded

    def copy(self, dst: np.ndarray, src: np.ndarray) -> bool:
        """Record a copy; whether to make it."""
        rec = self._mine()
        if rec is None:
            return True
        if dst.size:
            if src.dtype != dst.dtype or src.shape != dst.shape:
                raise NotLowerable("a copy between arrays of different shapes")
            rec.computation("copy", {"src": src, "dst": dst})
        return self.compute

    def avg(self, buf: np.ndarray, n: int) -> bool:
        """Record an AVG division; whether to make it."""
        rec = self._mine()
        if rec is None:
            return True
        rec.computation("avg", {"buf": buf}, dtype=str(buf.dtype), n=n)
        return self.compute


def _own_buffers(call: Any) -> Any:
    """``call`` on fresh buffers of the same shapes, ``src`` placed in ``dst`` as the caller's
    is (the same array in place, or a view of it: an allgather's own block)."""
    dst = np.empty_like(call.dst)
    src = call.src
    if src is call.dst:
        src = dst
    else:
        off = address(src) - address(call.dst)
        if src.nbytes and 0 <= off and off + src.nbytes <= call.dst.nbytes:
            src = dst.view(np.uint8)[off:off + src.nbytes].view(src.dtype)
        else:
            src = np.empty_like(src)
    return call._replace(src=src, dst=dst)


def _after_completion(task: Task, dep: Task) -> bool:
    """Whether ``task`` waits for ``dep`` to complete (not only to start)."""
    return any(s.listener is task and s.events & (1 << Event.COMPLETED) for s in dep.subscriptions)


def _in_order(tasks: List[Task]) -> List[Task]:
    """``tasks`` (of one schedule) with each after those it depends on, else in the order added."""
    ids = {id(t) for t in tasks}
    placed: set = set()
    order: List[Task] = []
    while len(order) < len(tasks):
        for t in tasks:
            if id(t) not in placed and all(id(d) in placed for d in t.dependencies if id(d) in ids):
                order.append(t)
                placed.add(id(t))
                break
        else:
            raise NotLowerable("a schedule whose dependencies form a cycle")
    return order


def lower_schedule(rec: Recorder, sched: Task, channel: Channel) -> None:
    """Record a schedule made of primitive tasks (sends and receives on ``channel`` with an int
    step, :class:`~pycoll.tasks.CopyTask`, :class:`~pycoll.tasks.ReduceTask`, and plain
    :class:`~pycoll.tasks.Schedule` s of them) into ``rec``: one instruction per task, depending on
    the instructions of the tasks it waits for (all of a schedule's, for a schedule). Anything else
    is :class:`NotLowerable`: its work is Python's own."""
    finished: Dict[int, List[int]] = {}  # id(task) -> the instructions that finish it

    def emit(ins: Instr, deps: List[int]) -> List[int]:
        ins.deps = sorted(set(deps))
        return [rec.append(ins)]

    def leaf(t: Task, deps: List[int]) -> List[int]:
        kind = type(t)
        if kind in (SendTask, RecvTask):
            if t.team is not channel:
                raise NotLowerable(f"{t.name}: posts on {t.team!r}, not on its collective's channel")
            if type(t.tag) is not int or not 0 <= t.tag <= MAX_STEP:
                raise NotLowerable(f"{t.name}: its tag {t.tag!r} is not a step (an int, 0-{MAX_STEP})")
            what = "send" if kind is SendTask else "recv"
            return emit(Instr(what, {"buf": rec.slice_of(t.buf)}, peer=t.peer, step=t.tag), deps)
        if kind is CopyTask:
            return emit(Instr("copy", {"src": rec.slice_of(t.src), "dst": rec.slice_of(t.dst)}), deps)
        if kind is ReduceTask:
            op = "sum" if t.op is ReduceOp.AVG else t.op.name.lower()
            slices = {"a": rec.slice_of(t.a), "b": rec.slice_of(t.b), "out": rec.slice_of(t.out)}
            done = emit(Instr("reduce", slices, op=op, dtype=str(t.out.dtype)), deps)
            if t.divide_by > 1 and t.out.size:  # (as finish_avg: nothing to divide by 1 or in nothing)
                done = emit(Instr("avg", {"buf": rec.slice_of(t.out)}, dtype=str(t.out.dtype), n=t.divide_by),
                            done)
            return done
        raise NotLowerable(f"{t.name} is a {kind.__name__}, not a primitive task (send, receive, copy, "
                           "reduce)")

    def walk(s: Task, outer: List[int]) -> List[int]:
        if type(s) is not Schedule:
            raise NotLowerable(f"{s.name} is a {type(s).__name__}, not a Schedule of primitive tasks")
        for t in _in_order(s.tasks):
            deps = list(outer)
            for d in t.dependencies:
                if d.parent is not s or not _after_completion(t, d):
                    raise NotLowerable(f"{t.name} waits for {d.name} to start, or outside its schedule")
                deps += finished[id(d)]
            finished[id(t)] = walk(t, deps) if isinstance(t, Schedule) else leaf(t, deps)
        return [i for t in s.tasks for i in finished[id(t)]]

    if sched.n_deps:
        raise NotLowerable(f"{sched.name} waits for other tasks")
    walk(sched, [])


def record(team: Any, call: Any, name: str, compute: bool = True, sizes_only: bool = False) -> Program:
    """The program of ``team``'s rank for ``call`` (a :class:`pycoll.collectives.Call`) with
    algorithm ``name``, not yet checked against the algorithm (see :func:`lower`). ``compute=False``
    skips the reductions and copies the algorithm makes through pycoll's kernels (only the steps
    are wanted: the simulator's recording of thousands of ranks); ``sizes_only`` records each
    instruction's size alone (:attr:`Recorder.sizes`, the program's ``sizes``: what the simulator
    reads)."""
    call = _own_buffers(call)  # (the recording computes on what no message brought: not the caller's)
    rec = Recorder(team.rank, sizes_only)
    rec.name(call.dst, "dst")
    if call.src is not call.dst:
        rec.name(call.src, "src")
    observer = _Observer(compute)
    previous, ops.observer = ops.observer, observer
    try:
        args = team.planner.args(call, ("c", 0), name, {})
        args.channel = RecordingChannel(rec)
        observer.rec = rec
        # an algorithm whose task cannot be recorded may give the form its programs are recorded
        # from: ``lowered(args)``, the same messages and arithmetic as primitive tasks
        form = getattr(algorithms.MODULES.get(call.coll, {}).get(name), "lowered", None)
        try:
            task = (form or algorithms.get(call.coll, name))(args)
        except (ValueError, TypeError) as exc:  # (the segment's forms need a shared segment, ...)
            raise NotLowerable(f"{call.coll}:{name} cannot be built on an in-process team: {exc}") from None
        if isinstance(task, Schedule):
            lower_schedule(rec, task, args.channel)
        elif not isinstance(task, StepTask) or task.n_deps:
            raise NotLowerable(f"{call.coll}:{name} is {type(task).__name__}, not one step generator")
        else:
            with np.errstate(all="ignore"):  # (it computes on whatever the receives left: nothing arrived)
                for _ in task.run():
                    rec.waited()
    finally:
        ops.observer = previous
        observer.rec = None
    return Program(call.coll, name, team.rank, team.size, call.dst.size, str(call.dst.dtype),
                   call.op.name.lower(), call.root, call.src is call.dst, dict(rec.buffers), rec.instrs,
                   None if call.layout is None else list(call.layout),
                   None if call.rlayout is None else list(call.rlayout), rec.sizes)
