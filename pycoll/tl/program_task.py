"""Lowered programs run by a transport's native executor, with no Python per step: what is the
same over every transport that has one (UCX: :mod:`pycoll.tl.ucx.executor`; one host's shared
memory: :mod:`pycoll.tl.shm.executor`).

:class:`NativeProgram` turns a :class:`pycoll.lower.Program` into the executors' instruction table
once (``native/exec.h``), behind the agreement check it runs itself where its calls are always
checked; :class:`NativeProgramTask` runs it for one call as one engine task: ``post`` points the
executor at the call's buffers and the collective's key, and each ``progress`` (the engine's
poll) lets the C code advance the program; :meth:`NativeProgramTask.express_run` starts and polls
a repeated call in one native call (the engine's express lane). An AVG division comes back to
Python (numpy's rounding rules). The transport's subclass says how its executor is started,
advanced and given up, and what its failures mean.

Only untagged collectives (``("c", seq)``, whose keys the executors compute) on an engine without
a credit or bandwidth limit run natively: under a credit limit the engine starts collectives on
demand from the messages the transports stash, which an executor's receives do not report, and a
bandwidth limit paces the transports' sends in Python.
"""

from __future__ import annotations

import abc
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from pycoll import config
from pycoll.buffers import scratch_array
from pycoll.dtypes import DTYPE_CODES
from pycoll.errors import MismatchError, PycollError
from pycoll.lower.execute import call_bytes
from pycoll.lower.program import SLICES, Instr, Program, ProgramError
from pycoll.ops import OP_CODES, ReduceOp, finish_avg
from pycoll.tasks.task import IN_PROGRESS, Task
from pycoll.tl.marks import MARK_BYTES
from pycoll.trace import tracer

_KINDS = {"send": 0, "recv": 1, "reduce": 2, "copy": 3, "avg": 4, "check": 5}
_SLICES = {**SLICES, "check": ("buf",)}  # (a check: the fingerprints gathered, one row per rank)
_AGREE_FLAG = 1  # (PC_F_AGREE)
_MISMATCH = 1  # (PC_ST_MISMATCH)
_MARK = 16  # (PC_ST_MARK)
_RUNNING, _DONE, _PYTHON = 0, 1, 2  # (PC_EXEC_RUNNING, PC_EXEC_DONE, PC_EXEC_PYTHON)
_POSTED = 1  # (PC_S_POSTED)
#: The longest an express run polls before handing its task to the engine (nanoseconds): the
#: engine's own spin (``PYCOLL_SPIN_US``); halved while peers keep this rank waiting, down to
#: ``1/MIN_FRACTION`` of it, doubled again when they do not.
MIN_FRACTION = 4
#: Where a host's ranks outnumber its cores: poll up to this long, yielding the core every
#: ``OVERSUBSCRIBED_YIELD`` polls (4 ranks on 2 cores, 8 B allreduce: 27-31 us a call spinning,
#: 12.5-14.4 us so; MPI 12.4-13.4 us).
OVERSUBSCRIBED_NS = 100_000
OVERSUBSCRIBED_YIELD = 4
_U8 = np.uint8


def _reduce_kernel(ffi: Any) -> Any:
    """pycoll._native's ``pycoll_reduce`` as a function pointer of this module's ffi."""
    from pycoll import _native  # noqa: PLC0415 - built at install

    nffi, nlib = _native.ffi, _native.lib

    address = int(nffi.cast("uintptr_t", nffi.addressof(nlib, "pycoll_reduce")))
    return ffi.cast("pc_reduce_fn", address)


class Check(NamedTuple):
    """The agreement check a native program runs first (see :func:`checked_instrs`): the program
    of the exchange of fingerprints (an allgather of ``WORDS`` uint64 per rank), this rank's
    fingerprint, and ``explain(recs)``, the error text of fingerprints (one row per rank) that
    disagree."""

    exchange: Program
    mine: np.ndarray
    explain: Callable[[np.ndarray], str]


def checked_instrs(check: Check, program: Program) -> Tuple[List[Instr], Dict[str, int], List[int]]:
    """``(instructions, buffers, flags)`` of ``program`` preceded by its agreement check: the
    exchange's instructions on buffers of their own (``agree_mine``, ``agree_recs``, ``agree_...``
    for its scratch) flagged to travel on the check's tags, then a ``check`` that compares what
    they gathered, then the collective's instructions, the first ones waiting for the check (as
    the Python check, :class:`pycoll.agreement.CheckedCall`, starts the collective only then)."""
    rename = {"src": "agree_mine", "dst": "agree_recs"}
    ex = check.exchange
    if "src" not in ex.buffers:
        raise ProgramError("an agreement check's exchange must read the fingerprint from a buffer of its own")
    instrs: List[Instr] = []
    for ins in ex.instrs:
        slices = {k: (rename.get(b, f"agree_{b}"), off, n) for k, (b, off, n) in ins.slices.items()}
        instrs.append(replace(ins, slices=slices, deps=list(ins.deps)))
    buffers = {rename.get(b, f"agree_{b}"): n for b, n in ex.buffers.items()}
    buffers["agree_recs"] = ex.buffers["dst"]
    at = len(instrs)
    instrs.append(Instr("check", {"buf": ("agree_recs", 0, ex.buffers["dst"])}, list(range(at))))
    flags = [_AGREE_FLAG] * at + [0]
    for ins in program.instrs:
        deps = [d + at + 1 for d in ins.deps] or [at]
        instrs.append(replace(ins, deps=deps))
        flags.append(0)
    buffers.update(program.buffers)
    return instrs, buffers, flags


class NativeProgram:
    """``program`` as the executor's instruction table (built once per program and transport),
    behind its agreement check if ``check`` is given."""

    def __init__(self, transport: Any, program: Program, check: Optional[Check] = None) -> None:
        ffi, lib = transport.native()
        self.transport, self.program, self.ffi, self.lib = transport, program, ffi, lib
        self.check = check
        if check is None:
            instrs, buffers, flags = program.instrs, program.buffers, [0] * len(program.instrs)
        else:
            instrs, buffers, flags = checked_instrs(check, program)
        self.instrs = instrs
        names = ["src", "dst"] + [b for b in buffers if b not in ("src", "dst")]
        index = {name: i for i, name in enumerate(names)}
        self.names, self.sizes = names, buffers
        n = len(instrs)
        self.ins = ffi.new("pc_instr_t[]", max(n, 1))
        deps: List[int] = []
        for i, ins in enumerate(instrs):
            c = self.ins[i]
            c.kind = _KINDS[ins.kind]
            c.peer, c.step, c.flags = ins.peer, ins.step, flags[i]
            c.ndeps, c.dep0 = len(ins.deps), len(deps)
            deps.extend(ins.deps)
            for k, field in enumerate(_SLICES[ins.kind]):  # (the order the C code reads them in)
                buf, off, nbytes = ins.slices[field]
                c.buf[k], c.off[k], c.len[k] = index[buf], off, nbytes
            if ins.kind == "reduce":
                dt = np.dtype(ins.dtype)
                c.op, c.dtype = OP_CODES[ReduceOp[ins.op.upper()]], DTYPE_CODES[dt]
                c.count = ins.slices["out"][2] // dt.itemsize
        self.deps = ffi.new("int32_t[]", deps or [0])
        #: What a call moves, per peer: [sent, received, messages sent, messages received].
        self.traffic: Dict[int, List[int]] = {}
        for ins in instrs:
            if ins.kind in ("send", "recv"):
                c = self.traffic.setdefault(ins.peer, [0, 0, 0, 0])
                k = 0 if ins.kind == "send" else 1
                c[k] += ins.slices["buf"][2]
                c[k + 2] += 1
        self.reduce = _reduce_kernel(ffi)
        self.avg = {i: (ins.slices["buf"], np.dtype(ins.dtype), ins.n)
                    for i, ins in enumerate(instrs) if ins.kind == "avg"}
        #: The peers the program receives from (in rank order).
        self.rpeers = sorted({ins.peer for ins in instrs if ins.kind == "recv"})



def prepared(transport: Any, cache: Dict[int, Any], program: Program,
             check: Optional[tuple] = None) -> NativeProgram:
    """``program``'s table for ``transport``'s executor: made once per program and kept in the
    transport's ``cache`` (64 at most), or one per task behind its agreement check ``check``
    (``(exchange program, fingerprint, explain)``: the fingerprint is its call's)."""
    if check is not None:
        return NativeProgram(transport, program, Check(*check))
    entry = cache.get(id(program))
    if entry is None or entry[0] is not program:
        if len(cache) >= 64:
            cache.clear()
        entry = cache[id(program)] = (program, NativeProgram(transport, program))
    return entry[1]


class NativeProgramTask(Task, metaclass=abc.ABCMeta):
    """One call of a prepared program (:class:`NativeProgram`) on ``args`` (a CollArgs of an
    untagged collective), run by its transport's executor. A subclass per transport makes the
    executor's state record (:attr:`STATE`) and gives the C calls, its abstract methods:
    :meth:`_setup`, :meth:`_start`, :meth:`_run`, :meth:`_advance`, :meth:`_did`, :meth:`_started`,
    :meth:`_stopped`, :meth:`_give_up` and :meth:`_error`."""

    #: The C type of the executor's state record.
    STATE = ""

    def __init__(self, args: Any, prepared: NativeProgram) -> None:
        super().__init__(f"{args.coll}:{prepared.program.algorithm or 'program'}@{args.rank}[native]",
                         nbytes=args.nbytes)
        program = prepared.program
        if program.rank != args.rank or program.size != args.size:
            raise ProgramError(f"a program of rank {program.rank} of {program.size} given to rank "
                               f"{args.rank} of {args.size}")
        self.args, self.prepared = args, prepared
        ffi = prepared.ffi
        n = len(prepared.instrs)
        self.scratch: Dict[str, np.ndarray] = {name: scratch_array(prepared.sizes[name], _U8)
                                               for name in prepared.names[2:]}
        if prepared.check is not None:  # (this rank's fingerprint: the same for every call of the shape)
            self.scratch["agree_mine"][:] = prepared.check.mine.view(_U8)
        self.scratch_bytes = sum(b.nbytes for b in self.scratch.values())
        e = self.e = ffi.new(f"{self.STATE} *")
        self._state = ffi.new("uint8_t[]", max(n, 1))
        self._bufs = ffi.new("char *[]", len(prepared.names))
        for i, name in enumerate(prepared.names[2:], 2):
            self._bufs[i] = ffi.cast("char *", ffi.from_buffer(self.scratch[name]))
        e.rank, e.size, e.n, e.nbufs = args.rank, args.size, n, len(prepared.names)
        e.ins, e.deps, e.bufs, e.state = prepared.ins, prepared.deps, self._bufs, self._state
        self._marks = ffi.new("uint8_t[]", MARK_BYTES * max(n, 1))  # (where each receive's mark lands)
        e.marks = self._marks
        self._markp: Any = None  # (e.mark: set once the planner gave the task its mark)
        self._tracer = tracer() if config.get("PYCOLL_TRACE_INSTRUCTIONS") else None
        if self._tracer is not None:  # (the executor notes when each instruction is issued and done)
            self._times = ffi.new("uint64_t[]", 2 * max(n, 1))
            e.times = self._times
        self._setup(e)
        self._keep: List[Any] = []  # the cffi views of the call's buffers the executor points at
        self._bound: tuple = ()  # (src, dst) those views are of: a call on the same arrays reuses them
        self._running = False
        #: How long the next express run may poll, in nanoseconds (0: as long as the most; see
        #: :meth:`express_run`).
        self.budget = 0

    # ------------------------------------------------------------------ the transport's part
    @abc.abstractmethod
    def _setup(self, e: Any) -> None:
        """Fill the transport's fields of the executor's state ``e`` (once)."""

    @abc.abstractmethod
    def _start(self, key: tuple) -> None:
        """Start the executor on this call's collective ``key`` (``("c", seq)``), with the
        transport told that a native program runs (:meth:`_started`)."""

    @abc.abstractmethod
    def _run(self, number: int, budget: int, every: int) -> int:
        """Start the executor as untagged collective ``number`` and advance it for up to
        ``budget`` nanoseconds, yielding the core every ``every`` polls (0: never), in one call;
        the executor's result code. The transport is not told (see :meth:`_started`)."""

    @abc.abstractmethod
    def _advance(self) -> int:
        """Advance the executor once; its result code."""

    @abc.abstractmethod
    def _did(self, i: int) -> None:
        """Tell the executor that Python ran instruction ``i`` (an AVG)."""

    @abc.abstractmethod
    def _started(self) -> None:
        """Tell the transport that this task's program runs (until :meth:`_stopped`)."""

    @abc.abstractmethod
    def _stopped(self) -> None:
        """Tell the transport that this task's program ended, failed or was cancelled."""

    @abc.abstractmethod
    def _give_up(self) -> None:
        """Stop the executor after a failure or a cancel; the transport keeps the task (so the
        buffers its peers may still read or write) for as long as that may happen."""

    @abc.abstractmethod
    def _error(self, i: int, what: str) -> PycollError:
        """The error of instruction ``i`` failing (``what``: the task and the instruction, in words)."""

    # ------------------------------------------------------------------ the task
    @property
    def program(self) -> Program:
        """The program this task runs."""
        return self.prepared.program

    @property
    def checks_itself(self) -> bool:
        """Whether the program runs its agreement check first (then the planner adds none)."""
        return self.prepared.check is not None

    def rebind(self, src: np.ndarray, dst: np.ndarray, key: tuple) -> None:
        """Reuse this finished task for another call of its program (new buffers and key)."""
        a = self.args
        a.src, a.dst = src, dst
        a.channel.rekey(key)
        self.reset()

    def unbind(self) -> None:
        self.args.src = self.args.dst = None
        self._keep, self._bound = [], ()

    def post(self) -> None:
        prepared, ffi = self.prepared, self.prepared.ffi
        program = prepared.program
        a = self.args
        if not self._bound or self._bound[0] is not a.src or self._bound[1] is not a.dst:
            self._keep = []
            for i, name in enumerate(("src", "dst")):
                if name not in program.buffers:
                    continue
                wire = call_bytes(a, name, program)
                ptr = ffi.from_buffer(wire)
                self._keep.append(ptr)
                self._bufs[i] = ffi.cast("char *", ptr)
            self._bound = (a.src, a.dst)
        if self._markp is None and self.mark is not None:
            self._point_at_mark()
        self._start(a.channel.key)
        self._running = True
        self.progress()

    def _point_at_mark(self) -> None:
        """Point the executor at the mark its messages carry (the task's, whose memory stays put:
        the planner stamps each call's history word into it)."""
        ffi = self.prepared.ffi
        self._markp = ffi.from_buffer(self.mark.buf)
        self.e.mark = ffi.cast("uint8_t *", self._markp)

    def express_run(self, number: int) -> bool:
        """Run this finished task again on the buffers it is bound to, as untagged collective
        ``number``, in one native call that starts the program and polls it for up to
        :attr:`budget` nanoseconds (the engine's express lane,
        :class:`pycoll.engine.express.ProgramLane`). True when it finished there (the task stays
        completed); else it is in progress, waiting for its peers, for the engine to poll (or it
        failed). The budget halves while peers keep this rank waiting (they may need its core)
        and doubles again when they do not; where the ranks outnumber the cores
        (``ctx.oversubscribed``) the core is yielded every few polls."""
        ctx = self.ctx
        if ctx.oversubscribed:  # (the peers may need this core: yield it often)
            most, every = OVERSUBSCRIBED_NS, OVERSUBSCRIBED_YIELD
        else:
            most, every = int(ctx.backoff[0] * 1e9), 0
        budget = self.budget if 0 < self.budget < most else most
        if self._markp is None and self.mark is not None:
            self._point_at_mark()
        rc = self._run(number, budget, every)
        if rc == _DONE:
            if budget < most:
                self.budget = budget * 2 if budget * 2 < most else most
            self._count_traffic()
            if self._tracer is not None:
                self._trace_instructions()
            return True
        if rc == _RUNNING and budget > most // MIN_FRACTION:
            self.budget = budget // 2
        self.args.channel.rekey(("c", number))
        self.result = None
        self.pending = 0
        self.state = IN_PROGRESS
        self._started()
        self._running = True
        try:
            self.progress()  # (an AVG's division, a failure; or still running)
        except Exception as exc:  # noqa: BLE001 - the task's failure, as the engine records it
            self.fail(exc)
        return False

    def progress(self) -> None:
        e = self.e
        while True:
            rc = self._advance()
            if rc == _RUNNING:
                return
            if rc == _DONE:
                self._count_traffic()
                if self._tracer is not None:
                    self._trace_instructions()
                self._ended()
                self.complete()
                return
            if rc == _PYTHON:
                i = e.next
                (buf, off, nbytes), dt, n = self.prepared.avg[i]
                arr = call_bytes(self.args, buf, self.program) if buf in ("src", "dst") else self.scratch[buf]
                finish_avg(arr[off:off + nbytes].view(dt), n)
                self._did(i)
                continue
            raise self._failure()

    def _trace_instructions(self) -> None:
        """Hand the tracer a span per instruction the executor issued (``PYCOLL_TRACE_INSTRUCTIONS``),
        one still running ending now."""
        times, now = self._times, time.monotonic()
        spans = []
        for i, ins in enumerate(self.prepared.instrs):
            t0 = times[2 * i]
            if not t0:
                continue
            t1 = times[2 * i + 1]
            args: Dict[str, Any] = {"parent": self.name, "instruction": i}
            if ins.kind in ("send", "recv"):
                args["peer"], args["nbytes"] = ins.peer, ins.slices["buf"][2]
            spans.append((f"{ins.kind} {i}", t0 * 1e-9, t1 * 1e-9 if t1 else now, args))
        self._tracer.subtasks(spans)

    def holding(self) -> tuple:
        """What must stay alive while the executor's posted messages may still be read or written
        after a failure: this task, the call's buffers and the views the executor points at
        (``unbind``, when its request is collected, drops the task's own references)."""
        return (self, list(self._keep), self.args.src, self.args.dst)

    def _count_traffic(self) -> None:
        traffic = self.prepared.transport.traffic
        for peer, counts in self.prepared.traffic.items():
            traffic.add(peer, counts)

    def _ended(self) -> None:
        if self._running:
            self._running = False
            self._stopped()

    def _failure(self) -> PycollError:
        e = self.e
        i = e.failed
        ins = self.prepared.instrs[i]
        if self._tracer is not None:
            self._trace_instructions()
        self._give_up()
        if ins.kind == "check" and e.status == _MISMATCH:
            recs = self.scratch["agree_recs"].view(np.uint64).reshape(self.args.size, -1)
            return MismatchError(self.prepared.check.explain(recs))
        if ins.kind == "recv" and e.status == _MARK and self.mark is not None:
            theirs = bytes(self.prepared.ffi.buffer(self._marks + MARK_BYTES * i, MARK_BYTES))
            return self.mark.judge(ins.peer, theirs, e.got, ins.slices["buf"][2])  # type: ignore[return-value]
        what = f"{self.name}: instruction {i} ({ins.kind}"
        what += f" of {ins.slices['buf'][2]} B with rank {ins.peer})" if ins.kind in ("send", "recv") else ")"
        return self._error(i, what)

    def on_cancel(self) -> None:
        self._give_up()

    def describe(self) -> str:
        e = self.e
        program = self.prepared
        waiting = [f"{program.instrs[i].kind} {i} with rank {program.instrs[i].peer}"
                   for i in range(e.lo, min(e.next, e.n)) if self._state[i] == _POSTED]
        label = f"{self.name} (instruction {e.next} of {e.n} next)"
        return f"{label}: waiting on " + ", ".join(waiting[:8]) if waiting else label
