"""Running programs: :class:`ProgramTask`, one engine task that runs one rank's program.

The task walks the instructions in order: a send or receive is posted on the collective's channel
(any transport) once the instructions it depends on are done; a reduction, copy or AVG division
runs once its dependencies are, with pycoll's kernels. A collective run from its program is one
task to the engine, like the algorithm it was lowered from, and takes credit and priority as that
one does (:func:`run_program`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Generator, Optional

import numpy as np

from pycoll import config
from pycoll.algorithms.base import CollArgs, StepTask, Waitable, as_wire
from pycoll.buffers import aliasing, scratch_array
from pycoll.collectives import COLLECTIVES
from pycoll.engine.request import Request
from pycoll.lower.program import Program, ProgramError, check
from pycoll.ops import ReduceOp, finish_avg, reducer
from pycoll.trace import tracer

_U8 = np.uint8


def call_bytes(call: Any, name: str, program: Program) -> np.ndarray:
    """The bytes of ``call``'s ``src`` or ``dst`` (a call or a task's args), as the program addresses
    them; :class:`ProgramError` unless they are as many as the program was made for."""
    wire = as_wire((call.dst if name == "dst" else call.src).reshape(-1))
    if wire.nbytes != program.buffers[name]:
        raise ProgramError(f"the program's {name} has {program.buffers[name]} B; this call's has "
                           f"{wire.nbytes} B")
    return wire


def kernels(instrs: Any) -> Dict[tuple, Any]:
    """pycoll's reduction kernel of each (op, dtype) the reductions of ``instrs`` use."""
    return {(i.op, i.dtype): reducer(ReduceOp[i.op.upper()], np.dtype(i.dtype))
            for i in instrs if i.kind == "reduce"}


def compute(ins: Any, view: Callable[[tuple], np.ndarray], kernels_of: Dict[tuple, Any]) -> None:
    """Do what the reduction, copy or AVG division ``ins`` says, on the slices ``view`` gives
    (with ``kernels_of``, :func:`kernels`): what an executor does when it issues one."""
    s = ins.slices
    if ins.kind == "reduce":
        dt = np.dtype(ins.dtype)
        kernels_of[(ins.op, ins.dtype)](view(s["a"]).view(dt), view(s["b"]).view(dt), view(s["out"]).view(dt))
    elif ins.kind == "copy":
        np.copyto(view(s["dst"]), view(s["src"]))
    else:  # avg
        finish_avg(view(s["buf"]).view(np.dtype(ins.dtype)), ins.n)


class ProgramTask(StepTask):
    """One rank's program, run on ``args`` (its channel and its call's buffers)."""

    def __init__(self, args: CollArgs, program: Program) -> None:
        super().__init__(args, name=f"{args.coll}:{program.algorithm or 'program'}@{args.rank}")
        if program.rank != args.rank or program.size != args.size:
            raise ProgramError(f"a program of rank {program.rank} of {program.size} given to rank "
                               f"{args.rank} of {args.size}")
        self.program = program
        #: The tracer that gets the instructions' spans (``PYCOLL_TRACE_INSTRUCTIONS``), or None.
        self.tracer = tracer() if config.get("PYCOLL_TRACE_INSTRUCTIONS") else None
        self._kernels = kernels(program.instrs)
        self._scratch_bytes = {name: scratch_array(nbytes, _U8) for name, nbytes in program.buffers.items()
                               if name not in ("src", "dst")}
        self.scratch_bytes = sum(b.nbytes for b in self._scratch_bytes.values())

    def _buffers(self) -> Dict[str, np.ndarray]:
        a, prog = self.args, self.program
        bufs = dict(self._scratch_bytes)
        for name in ("src", "dst"):
            if name in prog.buffers:
                bufs[name] = call_bytes(a, name, prog)
        return bufs

    def run(self) -> Generator[Waitable, None, None]:
        bufs = self._buffers()
        ch = self.args.channel
        reqs: Dict[int, Any] = {}

        def view(s: tuple) -> np.ndarray:
            return bufs[s[0]][s[1]:s[1] + s[2]]

        times: Optional[Dict[int, list]] = {} if self.tracer is not None else None
        for n, ins in enumerate(self.program.instrs):
            waits = [reqs[d] for d in ins.deps if d in reqs and not reqs[d].done]
            if waits:
                yield waits
            if times is not None:  # (a message's end: when this task saw it done)
                now = time.monotonic()
                for d in ins.deps:
                    if d in reqs and not times[d][1]:
                        times[d][1] = now
                times[n] = [now, 0.0]
            kind = ins.kind
            if kind == "send":
                reqs[n] = ch.isend(view(ins.slices["buf"]), ins.peer, ins.step)
            elif kind == "recv":
                reqs[n] = ch.irecv(view(ins.slices["buf"]), ins.peer, ins.step)
            else:
                compute(ins, view, self._kernels)
                if times is not None:
                    times[n][1] = time.monotonic()
        rest = [r for r in reqs.values() if not r.done]
        if rest:
            yield rest
        if times is not None:
            self._trace(times)

    def _trace(self, times: Dict[int, list]) -> None:
        """Hand the tracer a span per instruction (``PYCOLL_TRACE_INSTRUCTIONS``): issued to done
        (a message: to when this task saw it done)."""
        now, spans = time.monotonic(), []
        for n, (t0, t1) in times.items():
            ins = self.program.instrs[n]
            args: Dict[str, Any] = {"parent": self.name, "instruction": n}
            if ins.kind in ("send", "recv"):
                args["peer"], args["nbytes"] = ins.peer, ins.slices["buf"][2]
            spans.append((f"{ins.kind} {n}", t0, t1 or now, args))
        self.tracer.subtasks(spans)


def fits(program: Program, team: Any, call: Any) -> None:
    """Raise :class:`ProgramError` unless ``program`` was made for this rank of ``team`` and for
    a call of ``call``'s shape: collective, count, dtype, buffer sizes, in place or not, op, root."""
    if program.rank != team.rank or program.size != team.size:
        raise ProgramError(f"a program of rank {program.rank} of {program.size} given to rank "
                           f"{team.rank} of {team.size}")
    if call.coll != program.coll or call.dst.size != program.count or str(call.dst.dtype) != program.dtype:
        raise ProgramError(f"a program for {program.coll} of {program.count} x {program.dtype} given "
                           f"{call.coll} of {call.dst.size} x {call.dst.dtype}")
    for name in ("src", "dst"):
        if name in program.buffers:
            call_bytes(call, name, program)
    if "src" not in program.buffers and not program.in_place and call.src is not call.dst and call.src.size \
            and aliasing(call.src, call.dst) is None:
        raise ProgramError("a program that reads the call's src inside its dst (made for a send buffer "
                           "that is a view of the receive buffer) given a src apart from its dst")
    if (call.src is call.dst) != program.in_place:
        raise ProgramError(f"a program made {'in' if program.in_place else 'out of'} place given a call "
                           f"{'out of' if program.in_place else 'in'} place")
    row = COLLECTIVES[call.coll]
    if row.reduces and call.op.name.lower() != program.op:
        raise ProgramError(f"a program for op {program.op} given {call.op.name.lower()}")
    if row.rooted and call.root != program.root:
        raise ProgramError(f"a program for root {program.root} given root {call.root}")
    for name in ("layout", "rlayout"):
        made, given = getattr(program, name), getattr(call, name)
        made = None if made is None else [tuple(b) for b in made]
        if made != (None if given is None else list(given)):
            raise ProgramError(f"a program for the blocks (displacement, count) {made} given {given}")


def run_program(team: Any, program: Program, call: Any, priority: int = 0,
                timeout: Optional[float] = None) -> Request:
    """Start ``program`` on ``team`` for ``call`` (a checked call, see ``team.call``): one task,
    keyed like an untagged collective (post programs in the same order on every rank), with the
    credit and priority of a collective; run by the transport's native executor where it has one
    (UCX: :mod:`pycoll.tl.ucx.executor`), else in Python (:class:`ProgramTask`)."""
    fits(program, team, call)
    planner = team.planner
    ctx = planner.ctx
    # finished tasks of this program are kept for reuse, as the planner keeps collectives'
    shape = ("program", id(program), call.src is call.dst, ctx.credit_bytes)
    with ctx.lock:
        task: Any = planner.pooled(shape)
        if task is not None and task.program is program:
            key = planner.coll_key(None)
            task.rebind(call.src, call.dst, key)
            if task.credit and ctx.credit_bytes:
                ctx.watch_demand(task, team.transport, key)
        else:
            if task is not None:
                task.finalize()  # (another program that had this one's id)
            check(program)  # (a program is read when a task is built for it: later edits are not seen)
            args = planner.args(call, ("c", -1), program.algorithm or "program", {})
            native = getattr(team.transport, "program_task", None)
            task = native(args, program, ctx.credit_bytes) if native is not None else None
            if task is None:
                task = ProgramTask(args, program)
            key = planner.coll_key(None)  # (only now: nothing above took a sequence number and failed)
            args.channel.rekey(key)
            task.owner = planner
            planner.credit_unit(task, key)
        return planner.submit(task, priority, timeout, call.out, shape=shape)
