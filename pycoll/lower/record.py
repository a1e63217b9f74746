"""Lowering: record what a built-in (or a user's) algorithm does on every rank as programs.

:func:`lower` builds the algorithm's task for each rank of an in-process team (the arguments the
team would give it) and runs its generator straight through on a channel that records instead of
sending: every request it yields is done at once, so the control flow (which never depends on the
data in these algorithms) goes through every step. What it records:

- each ``isend`` / ``irecv`` / ``exchange`` as send and receive instructions, on the step number
  the algorithm gave;
- each reduction through a kernel of :func:`pycoll.ops.reducer` (or ``reduce_into``), each copy
  through :func:`pycoll.ops.copy_into` and each AVG division, through :data:`pycoll.ops.observer`.

Buffers are told apart by the array that owns their memory: the call's ``src`` and ``dst``, and
any other (an algorithm's scratch, a temporary) becomes a scratch buffer of the program, its
slices located by address. Each instruction depends on the requests of the last group the
algorithm waited for and on the computations since: the order in which the generator would run.

An algorithm may compute in ways the recorder does not see (numpy calls of its own): so the
programs are then run (:mod:`pycoll.lower.execute`, in-process) against the algorithm itself on
the same data, and :func:`lower` raises :class:`NotLowerable` unless every rank's output has the
same bits. Algorithms that are not one generator (schedules of tasks, the shared segment's
native collectives) are not lowered either.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from pycoll import algorithms, ops
from pycoll.algorithms.base import StepTask
from pycoll.errors import PycollError
from pycoll.lower.execute import run_program
from pycoll.lower.program import Instr, Program, Slice, check_set
from pycoll.ops import ReduceOp
from pycoll.team import local_teams
from pycoll.tl.base import Channel, TransportRequest

#: The collectives :func:`lower` takes (with equal blocks; the v-forms not yet).
LOWERED = ("allreduce", "reduce", "bcast", "allgather", "reduce_scatter", "alltoall", "gather", "scatter",
           "barrier")


class NotLowerable(PycollError):
    """The algorithm cannot be lowered to programs (it runs in Python as it is)."""


def _root(arr: np.ndarray) -> np.ndarray:
    """The array that owns ``arr``'s memory."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


def _addr(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


class Recorder:
    """The instructions of one rank, and where its buffers are."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.instrs: List[Instr] = []
        self.buffers: Dict[str, int] = {}
        self._ranges: List[Tuple[int, int, str, np.ndarray]] = []  # (start, end, name, the array: kept)
        self._group: List[int] = []  # the requests of the last group yielded
        self._since: List[int] = []  # computations since
        self._pending: List[int] = []  # requests posted since the last yield

    def name(self, arr: np.ndarray, name: str) -> None:
        """Call the memory of ``arr`` ``name`` (``dst``, ``src``: the call's own arrays, named
        first, so a slice inside one of them is named by it; then scratch buffers)."""
        start = _addr(arr)
        self._ranges.append((start, start + arr.nbytes, name, arr))
        self.buffers[name] = arr.nbytes

    def slice_of(self, arr: np.ndarray) -> Slice:
        if arr.size and not arr.flags.c_contiguous:
            raise NotLowerable("a buffer that is not contiguous")
        start, end = _addr(arr), _addr(arr) + arr.nbytes
        for lo, hi, name, _ in self._ranges:
            if lo <= start and end <= hi and (arr.nbytes or lo < hi or start == lo):
                return (name, start - lo, arr.nbytes)
        root = _root(arr)  # memory of the algorithm's own: a scratch buffer, all of its owner
        name = f"scratch{sum(1 for n in self.buffers if n.startswith('scratch'))}"
        self.name(root, name)
        return (name, start - _addr(root), arr.nbytes)

    def add(self, ins: Instr, request: bool) -> int:
        ins.deps = sorted(set(self._group) | set(self._since))
        n = len(self.instrs)
        self.instrs.append(ins)
        (self._pending if request else self._since).append(n)
        return n

    def waited(self) -> None:
        """The algorithm yielded: what follows waits for the requests posted so far."""
        self._group = self._pending + self._group if not self._since else list(self._pending)
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
        self.rec.add(Instr("send", {"buf": self.rec.slice_of(buf)}, peer=peer, step=step), True)
        return self._req("send", peer, step, buf.nbytes)

    def irecv(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        self.rec.add(Instr("recv", {"buf": self.rec.slice_of(buf)}, peer=peer, step=step), True)
        return self._req("recv", peer, step, buf.nbytes)

    def exchange(self, sendbuf: np.ndarray, recvbuf: np.ndarray, peer: int, step: int) -> TransportRequest:
        self.isend(sendbuf, peer, step)
        return self.irecv(recvbuf, peer, step)


class _Observer:
    """What :data:`pycoll.ops.observer` is while a rank's task is built and run: it records the
    computations into the recorder of the rank being run."""

    def __init__(self) -> None:
        self.rec: Optional[Recorder] = None
        self.thread = threading.get_ident()  # (other threads' collectives are not recorded)

    def _mine(self) -> Optional[Recorder]:
        return self.rec if threading.get_ident() == self.thread else None

    def reducer(self, op: ReduceOp, dtype: np.dtype, fn: Any) -> Any:
        if self._mine() is None:
            return fn
        name = ("sum" if op is ReduceOp.AVG else op.name.lower())

        def recorded(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            rec = self._mine()
            if rec is not None and out.size:
                slices = {"a": rec.slice_of(a), "b": rec.slice_of(b), "out": rec.slice_of(out)}
                rec.add(Instr("reduce", slices, op=name, dtype=str(out.dtype)), False)
            fn(a, b, out)
        return recorded

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        rec = self._mine()
        if rec is not None and dst.size:
            if src.dtype != dst.dtype or src.shape != dst.shape:
                raise NotLowerable("a copy between arrays of different shapes")
            rec.add(Instr("copy", {"src": rec.slice_of(src), "dst": rec.slice_of(dst)}), False)

    def avg(self, buf: np.ndarray, n: int) -> None:
        rec = self._mine()
        if rec is not None:
            rec.add(Instr("avg", {"buf": rec.slice_of(buf)}, dtype=str(buf.dtype), n=n), False)


def record(team: Any, call: Any, name: str) -> Program:
    """The program of ``team``'s rank for ``call`` (a :class:`pycoll.collectives.Call`) with
    algorithm ``name``, not yet checked against the algorithm (see :func:`lower`)."""
    rec = Recorder(team.rank)
    rec.name(call.dst, "dst")
    if call.src is not call.dst:
        rec.name(call.src, "src")
    observer = _Observer()
    previous, ops.observer = ops.observer, observer
    try:
        args = team.planner.args(call, ("c", 0), name, {})
        args.channel = RecordingChannel(rec)
        observer.rec = rec
        try:
            task = algorithms.get(call.coll, name)(args)
        except (ValueError, TypeError) as exc:  # (the segment's forms need a shared segment, ...)
            raise NotLowerable(f"{call.coll}:{name} cannot be built on an in-process team: {exc}") from None
        if not isinstance(task, StepTask) or task.n_deps:
            raise NotLowerable(f"{call.coll}:{name} is {type(task).__name__}, not one step generator")
        with np.errstate(all="ignore"):  # (it computes on whatever the receives left: nothing arrived)
            for _ in task.run():
                rec.waited()
    finally:
        ops.observer = previous
        observer.rec = None
    return Program(call.coll, name, team.rank, team.size, call.dst.size, str(call.dst.dtype),
                   call.op.name.lower(), call.root, call.src is call.dst, dict(rec.buffers), rec.instrs)


def lower(coll: str, algorithm: str, size: int, count: int, dtype: Any = "float32", op: Any = "sum",
          root: int = 0, in_place: bool = False, verify: bool = True) -> List[Program]:
    """The programs (rank 0 first) of ``coll`` by ``algorithm`` on ``size`` ranks for ``count``
    elements of ``dtype``: recorded on an in-process team, checked as a set, and (``verify``) run
    against the algorithm on the same inputs. Raises :class:`NotLowerable` for an algorithm that
    cannot be lowered, naming why."""
    teams = local_teams(size)
    try:
        calls = [make_call(t, coll, count, dtype, op, root, in_place, seed=0) for t in teams]
        programs = [record(t, c, algorithm) for t, c in zip(teams, calls)]
        check_set(programs)
        if verify:
            compare(programs, teams, coll, count, dtype, op, root, in_place)
    finally:
        for t in teams:
            t.close()
    return programs


def inputs(rank: int, coll: str, size: int, count: int, dtype: Any, seed: int) -> np.ndarray:
    """Rank ``rank``'s input for a lowering check: small integers (exact in any order), distinct
    per rank and per seed."""
    n = count * size if coll in ("alltoall", "reduce_scatter", "scatter") else count
    values = (np.arange(n, dtype=np.int64) * 7 + rank * 13 + seed * 5) % 11 - 5
    dt = np.dtype(dtype)
    if dt.kind in "ub":
        values = np.abs(values)
    return values.astype(dt)


def make_call(team: Any, coll: str, count: int, dtype: Any, op: Any, root: int, in_place: bool,
              seed: int) -> Any:
    """The checked call of ``coll`` on ``team`` with fresh inputs (see :func:`inputs`): what
    lowering records and compares with, and what a test runs a program on."""
    x = inputs(team.rank, coll, team.size, count, dtype, seed)
    if coll in ("allreduce",):
        return team.call(coll, x, None if in_place else np.empty_like(x), op)
    if coll == "reduce":
        return team.call(coll, x, None if in_place else np.empty_like(x), op, root)
    if coll == "bcast":
        return team.call(coll, x, root)
    if coll == "allgather":
        return team.call(coll, x, np.empty(x.size * team.size, x.dtype))
    if coll == "reduce_scatter":
        return team.call(coll, x, np.empty(count, x.dtype), op)
    if coll == "alltoall":
        return team.call(coll, x, np.empty_like(x))
    if coll == "gather":
        return team.call(coll, x, np.empty(count * team.size, x.dtype) if team.rank == root else None, root)
    if coll == "scatter":
        return team.call(coll, x if team.rank == root else None, np.empty(count, x.dtype), root)
    if coll == "barrier":
        return team.call(coll)
    raise NotLowerable(f"lowering {coll} is not supported yet (one of: {', '.join(LOWERED)})")


def compare(programs: Sequence[Program], teams: Sequence[Any], coll: str, count: int, dtype: Any, op: Any,
            root: int, in_place: bool) -> None:
    """Run ``programs`` and the algorithm they came from on ``teams`` (in-process, one per rank)
    with the same inputs; raise NotLowerable unless every rank's output has the same bits."""
    algorithm = programs[0].algorithm
    outs: List[List[np.ndarray]] = []
    for lowered in (False, True):
        calls = [make_call(t, coll, count, dtype, op, root, in_place, seed=1) for t in teams]
        if lowered:
            reqs = [run_program(t, p, c) for t, p, c in zip(teams, programs, calls)]
        else:
            reqs = [t.planner.post(c, 0, None, algorithm, None, {}) for t, c in zip(teams, calls)]
        for r in reqs:
            r.wait(timeout=60)
        outs.append([c.dst.copy() for c in calls])
    for r, (want, got) in enumerate(zip(*outs)):
        if coll in ("reduce", "gather") and r != root:
            continue
        if want.tobytes() != got.tobytes():
            raise NotLowerable(f"{coll}:{algorithm} computes in ways the recording does not see: rank {r}'s "
                               "output from its program differs from the algorithm's")
