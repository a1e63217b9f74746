"""Where the microseconds of one small collective go: a per-stage breakdown, rerunnable.

Each rank times ``iters`` blocking calls of a collective (8 B by default) without a profiler (the
real cost per call, next to MPI's own collective in the same run), then runs the same loop under
cProfile and splits the profiled time into stages by the function that spent it. Two rows per
collective: ``repeat`` calls it on the same buffers every time (a loop's case: from the second
call a start of its persistent form, the engine's express lane), ``new`` on one of 256 buffers in
turn (every call checked, its task taken from the pool and rebound):

    checks      argument checks (pycoll.calls, buffers, ops.check_op/as_op; the drop-in's forms: mpispec)
    front end   the team's collective method and the planner's post/build (selection is cached)
    express     a repeated call run again (persistent.py, the engine's express lane: engine/express.py)
    selection   algorithm selection when the cache misses (planner.select, algorithms.select)
    task        rebinding the pooled task to the new buffers and key (rebind, rekey)
    engine      submit and start (engine.context: submit, _start, progress; task states)
    algorithm   the algorithm's own Python (post/progress/run of its task)
    native      the compiled calls (pycoll._native: segment progress, reductions)
    transport   the transport's Python (pycoll.tl: channels, requests, MPI/UCX/TCP calls)
    completion  completion and the request (task.complete, Request.wait, planner.recycle)
    waiting     back-off while the peer is not there yet (sleep, sched_yield, spin passes)

The profile inflates Python calls more than C calls, so the shares are scaled to the unprofiled
time per call: read them as where the time goes, not to the nanosecond.

    mpiexec -n 2 python benchmarks/call_cost.py [--colls allreduce,bcast,gather,scatter,alltoall,barrier,
        persistent,Comm.Allreduce] [--bytes 8] [--iters 20000]

``persistent`` is ``team.allreduce_init(x, y)`` then ``start().wait()``; ``Comm.Allreduce`` the
mpi4py drop-in (:class:`pycoll.mpi.Comm`); both against ``comm.Allreduce``. ``Comm.Bcast<form>``
is the drop-in's Bcast of one buffer form as mpi4py users write it (``Comm.Bcast[a BYTE]``,
``Comm.Bcast[mmap n BYTE]``, ``Comm.Bcastbytearray``...: see ``FORMS``), against ``comm.Bcast`` of
the same object; ``--colls forms`` runs every one.
"""

from __future__ import annotations

import argparse
import array
import cProfile
import itertools
import mmap
import pstats
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
from mpi4py import MPI

from pycoll import Team
from pycoll.mpi import Comm as DropIn

STAGES = ("checks", "front end", "express", "selection", "task", "engine", "algorithm", "native",
          "transport", "completion", "waiting", "other")


def stage_of(filename: str, function: str) -> str:
    """The stage a profiled function belongs to (see the module docstring)."""
    f = filename.replace("\\", "/")
    if function in ("sleep", "sched_yield") or function in ("idle", "reset") and "engine/context" in f:
        return "waiting"
    if "pycoll/calls.py" in f or "pycoll/buffers.py" in f or "pycoll/mpispec.py" in f or \
            function in ("check_op", "as_op"):
        return "checks"
    if "pycoll/persistent.py" in f or "engine/express.py" in f:
        return "express"
    if function in ("select", "choose", "rules") or "algorithms/tuning.py" in f:
        return "selection"
    if "pycoll/team.py" in f or "<string>" in f or (
            "pycoll/planner.py" in f and function in ("post", "build")):
        return "front end"
    if function in ("rebind", "rekey", "ticket", "credit_unit"):
        return "task"
    if "pycoll/planner.py" in f or "engine/request.py" in f or function == "complete" or function == "notify":
        return "completion"
    if "engine/context.py" in f or "tasks/task.py" in f or "tasks/schedule.py" in f:
        return "engine"
    if "pycoll/algorithms/" in f:
        return "algorithm"
    if "_native" in function or "_native" in f or "tl/shm/segment.py" in f:
        return "native"
    if "pycoll/tl/" in f or "mpi4py" in f or "MPI" in function:
        return "transport"
    return "other"


#: Buffers the ``new`` rows take in turn (more than the calls a team remembers).
ROTATE = 256
#: The collectives timed both ways; the others (barrier, persistent, Comm.Allreduce) once.
ROTATING = ("allreduce", "bcast", "gather", "scatter", "alltoall")


def call_of(coll: str, team: Team, nbytes: int,
            rotate: int = 1) -> Tuple[Callable[[], Any], Callable[[], Any]]:
    """(pycoll call, MPI call) of ``coll`` with ``nbytes`` per rank's block (float32); the pycoll
    call takes the next of ``rotate`` sets of buffers each time."""
    n, comm = team.size, team.comm
    count = max(1, nbytes // 4)
    sets = [(np.ones(count, np.float32), np.ones(count * n, np.float32), np.empty(count * n, np.float32),
             np.empty(count, np.float32)) for _ in range(rotate)]
    x, whole, out, y = sets[0]
    turn = itertools.cycle(sets).__next__
    if coll == "allreduce":
        def py() -> Any:
            b = turn()
            return team.allreduce(b[0], b[3]).wait()
        return py, (lambda: comm.Allreduce(x, y))
    if coll == "bcast":
        return (lambda: team.bcast(turn()[0], 0).wait()), (lambda: comm.Bcast(x, root=0))
    if coll == "gather":
        def py() -> Any:
            b = turn()
            return team.gather(b[0], b[2], 0).wait()
        return py, (lambda: comm.Gather(x, out, root=0))
    if coll == "scatter":
        def py() -> Any:
            b = turn()
            return team.scatter(b[1], b[3], 0).wait()
        return py, (lambda: comm.Scatter(whole, y, root=0))
    if coll == "alltoall":
        def py() -> Any:
            b = turn()
            return team.alltoall(b[1], b[2]).wait()
        return py, (lambda: comm.Alltoall(whole, out))
    if coll == "barrier":
        return (lambda: team.barrier().wait()), (lambda: comm.Barrier())
    if coll == "persistent":  # allreduce_init once, then start().wait()
        p = team.allreduce_init(x, y)
        return (lambda: p.start().wait()), (lambda: comm.Allreduce(x, y))
    if coll == "Comm.Allreduce":  # the mpi4py drop-in
        pcomm = DropIn(comm)
        return (lambda: pcomm.Allreduce(x, y)), (lambda: comm.Allreduce(x, y))
    if coll.startswith("Comm.Bcast"):  # the drop-in's Bcast of one buffer form (FORMS), both the same
        buf = FORMS[coll[len("Comm.Bcast"):] or "ndarray"](nbytes)
        pcomm = DropIn(comm)
        return (lambda: pcomm.Bcast(buf, 0)), (lambda: comm.Bcast(buf, 0))
    raise SystemExit(f"call_cost: no case for {coll!r}")


#: The buffer forms of the ``Comm.Bcast<form>`` rows, as mpi4py users pass them (the same objects
#: at every call; ``[mmap n BYTE]`` is the OSU demos' form: ``n`` bytes of a 1 MiB mmap).
FORMS: Dict[str, Callable[[int], Any]] = {
    "ndarray": lambda n: np.zeros(n, np.uint8),
    "[a BYTE]": lambda n: [np.zeros(n, np.uint8), MPI.BYTE],
    "[a n BYTE]": lambda n: [np.zeros(n, np.uint8), n, MPI.BYTE],
    "[big n BYTE]": lambda n: [np.zeros(1 << 20, np.uint8), n, MPI.BYTE],
    "mmap": lambda n: mmap.mmap(-1, n),
    "[mmap n BYTE]": lambda n: [mmap.mmap(-1, 1 << 20), n, MPI.BYTE],
    "bytearray": lambda n: bytearray(n),
    "memoryview": lambda n: memoryview(bytearray(n)),
    "array": lambda n: array.array("B", bytes(n)),
}


def timed(call: Callable[[], Any], iters: int, comm: Any) -> float:
    """Seconds per call, best of 3 loops (max over ranks)."""
    best = float("inf")
    for _ in range(3):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        best = min(best, (time.perf_counter() - t0) / iters)
    return comm.allreduce(best, op=MPI.MAX)


def breakdown(call: Callable[[], Any], iters: int, comm: Any) -> Dict[str, float]:
    """Profiled seconds per stage (this rank), per call."""
    prof = cProfile.Profile()
    comm.Barrier()
    prof.enable()
    for _ in range(iters):
        call()
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, function): (cc, nc, tottime, cumtime, callers)}
    out = dict.fromkeys(STAGES, 0.0)
    for (filename, _, function), (_, _, tottime, _, callers) in stats.items():
        if filename == __file__ or "_lsprof" in function:
            continue  # this benchmark's own loop
        if filename == "~" and callers:  # a builtin (dict.get, heappush, ...): its callers' stage
            for (cfile, _, cfunction), (_, _, ctime, _) in callers.items():
                if function in ("sleep", "sched_yield"):
                    out["waiting"] += ctime / iters
                elif cfile != __file__:
                    out[stage_of(cfile, cfunction)] += ctime / iters
            continue
        out[stage_of(filename, function)] += tottime / iters
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--colls", default=",".join(ROTATING + ("barrier", "persistent", "Comm.Allreduce")),
                        help="collectives (comma-separated); forms: every Comm.Bcast<form> row")
    parser.add_argument("--bytes", type=int, default=8, help="bytes per rank's block")
    parser.add_argument("--iters", type=int, default=20000)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    team = Team.from_mpi(comm)
    rank, n = team.rank, team.size
    if rank == 0:
        transport = f"shm+{team.transport.name}" if team.shared is not None else team.transport.name
        print(f"# call_cost: {n} ranks, {args.bytes} B per block, float32, transport {transport}; "
              "us per call; stages from cProfile (rank 0) scaled to the unprofiled time")
    rows: List[Tuple[str, float, float, Dict[str, float]]] = []
    colls = args.colls.replace("forms", ",".join(f"Comm.Bcast{f}" for f in FORMS)).split(",")
    for coll in colls:
        kinds = (("repeat", 1), ("new", ROTATE)) if coll in ROTATING else (("", 1),)
        for kind, rotate in kinds:
            py, mp = call_of(coll, team, args.bytes, rotate)
            for _ in range(2000):  # warm up: the task pool, the segment, MPI
                py()
                mp()
            t_py = timed(py, args.iters, comm)
            t_mpi = timed(mp, args.iters, comm)
            stages = breakdown(py, args.iters // 4, comm)
            rows.append((f"{coll} {kind}".strip(), t_py, t_mpi, stages))
    if rank == 0:
        print(f"{'collective':<24} {'pycoll':>7} {'MPI':>6} " + " ".join(f"{s:>10}" for s in STAGES))
        for name, t_py, t_mpi, stages in rows:
            total = sum(stages.values()) or 1.0
            scaled = [stages[s] / total * t_py * 1e6 for s in STAGES]
            cells = " ".join(f"{v:>10.2f}" for v in scaled)
            print(f"{name:<24} {t_py * 1e6:>7.2f} {t_mpi * 1e6:>6.2f} {cells}")
    team.close()


if __name__ == "__main__":
    main()
