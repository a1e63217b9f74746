"""The programs a simulation runs: the real algorithm, recorded rank by rank (pycoll.lower).

Every rank's program is recorded from the algorithm pycoll runs (its builder on an in-process team
of ``size`` ranks, the same code as on a real team), without computing: buffers are allocated but
never touched, so a rank's program costs its instructions only. Sizes follow ``pycoll perf``: the
buffer for allreduce, bcast and reduce; the ``n`` blocks together for the block collectives.
Algorithms that do not lower (the shared segment's, pipelined and hierarchical schedules) cannot be
simulated yet: :class:`~pycoll.lower.record.NotLowerable` says why.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from array import array
from typing import Any, Callable, List, Optional

import numpy as np

from pycoll.lower.record import NotLowerable, record
from pycoll.sim.engine import CALL, Compact, edges_csr
from pycoll.team import local_teams

#: The collectives a simulation runs (the lowered ones of equal blocks: not yet the v-forms, scan).
SIMULATED = ("allreduce", "reduce", "bcast", "allgather", "reduce_scatter", "alltoall", "gather", "scatter",
             "barrier")
#: The collectives whose size is the n blocks together (block = size / n).
BLOCKS = ("allgather", "reduce_scatter", "alltoall", "gather", "scatter")
#: Algorithms simulated as two lowered ones in a row on every rank (the second starts on a rank
#: once the first is done there): pycoll's ring allreduce runs the same steps as a reduce_scatter
#: ring and an allgather ring, but pipelined in fragments (not modelled yet); Rabenseifner's is
#: recursive halving then recursive doubling.
COMPOSITES = {("allreduce", "ring"): (("reduce_scatter", "ring"), ("allgather", "ring")),
              ("allreduce", "rabenseifner"): (("reduce_scatter", "rhalving"), ("allgather", "rd"))}


def elements(coll: str, nbytes: int, size: int, itemsize: int) -> int:
    """The ``count`` of a call of ``nbytes`` (per-rank block for the block collectives)."""
    if coll in BLOCKS:
        return max(1, nbytes // itemsize // size)
    return max(1, nbytes // itemsize)


def moved(coll: str, algorithm: str, nbytes: int, size: int, itemsize: int) -> int:
    """The bytes a call of nominal ``nbytes`` really has (block collectives: whole blocks)."""
    parts = COMPOSITES.get((coll, algorithm))
    inner = parts[0][0] if parts else coll
    count = elements(inner, nbytes, size, itemsize)
    return count * itemsize * (size if inner in BLOCKS else 1)


def _call(team: Any, coll: str, count: int, dtype: Any, op: str, root: int) -> Any:
    """The checked call of ``coll`` on ``team`` with untouched buffers."""
    e = np.empty
    n, r = team.size, team.rank
    if coll == "allreduce":
        return team.call(coll, e(count, dtype), e(count, dtype), op)
    if coll == "reduce":
        return team.call(coll, e(count, dtype), e(count, dtype), op, root)
    if coll == "bcast":
        return team.call(coll, e(count, dtype), root)
    if coll == "allgather":
        return team.call(coll, e(count, dtype), e(count * n, dtype))
    if coll == "reduce_scatter":
        return team.call(coll, e(count * n, dtype), e(count, dtype), op)
    if coll == "alltoall":
        return team.call(coll, e(count * n, dtype), e(count * n, dtype))
    if coll == "gather":
        return team.call(coll, e(count, dtype), e(count * n, dtype) if r == root else None, root)
    if coll == "scatter":
        return team.call(coll, e(count * n, dtype) if r == root else None, e(count, dtype), root)
    if coll == "barrier":
        return team.call(coll)
    raise NotLowerable(f"simulating {coll} is not supported (one of: {', '.join(SIMULATED)})")


def chain(a: Compact, b: Compact, offset: Optional[int] = None) -> Compact:
    """``a`` then ``b`` on one rank: ``b``'s first instructions wait for ``a``'s last; ``b``'s
    steps are numbered after ``a``'s (their messages never match each other's), or from
    ``offset`` (the same on every rank, where their programs end at different steps)."""
    n, m = len(a.kinds), len(b.kinds)
    if offset is None:
        offset = max(a.steps, default=-1) + 1
    af, ad = np.frombuffer(a.first, np.int32), np.frombuffer(a.dependents, np.int32)
    bf, bd = np.frombuffer(b.first, np.int32), np.frombuffer(b.dependents, np.int32)
    sinks = np.flatnonzero(af[1:] == af[:-1]).astype(np.int32)  # (what nothing of a waits for)
    b_ndeps = np.frombuffer(b.ndeps, np.int32).copy()
    roots = np.flatnonzero(b_ndeps == 0).astype(np.int32)  # (what waits for nothing in b)
    b_ndeps[roots] = len(sinks)
    waited = np.concatenate([np.repeat(np.arange(n, dtype=np.int32), np.diff(af)),
                             np.repeat(sinks, len(roots)),
                             np.repeat(np.arange(m, dtype=np.int32), np.diff(bf)) + n])
    waiting = np.concatenate([ad, np.tile(roots + n, len(sinks)), bd + n]).astype(np.int32)
    first, dependents = edges_csr(waited, waiting, n + m)
    steps = array("i", (np.frombuffer(b.steps, np.int32) + offset).astype(np.int32).tobytes())
    return Compact(a.kinds + b.kinds, a.peers + b.peers, a.steps + steps, a.nbytes + b.nbytes,
                   a.ndeps + array("i", b_ndeps.tobytes()), first, dependents)


def called(p: Compact) -> Compact:
    """``p`` behind a ``CALL`` instruction (the rank's time starting the call, the machine's
    ``call``): what waited for nothing waits for it."""
    start = Compact.build([CALL], [-1], [0], [0], [[]])
    return chain(start, p, 0)


def looped(programs: List[Compact], calls: int, call: bool = False) -> List[Compact]:
    """Every rank's ``calls`` runs of its program, one after another (:func:`chain`): a loop of
    calls, each rank's next call once its last one finished, as ``pycoll perf`` times them; with
    ``call``, each run starts with a ``CALL`` (:func:`called`)."""
    span = max((max(p.steps, default=-1) for p in programs), default=-1) + 1
    if call:
        programs = [called(p) for p in programs]
    # by doubling (a block of 2^k calls chained to itself), each call's steps k * span on
    out: Optional[List[Compact]] = None
    block, size, done = list(programs), 1, 0
    while calls:
        if calls & 1:
            out = block if out is None else [chain(o, b, done * span) for o, b in zip(out, block)]
            done += size
        calls >>= 1
        if calls:
            block = [chain(b, b, size * span) for b in block]
            size *= 2
    return out if out is not None else []


#: The fewest ranks whose programs are recorded by several processes (below, one process is quicker).
PARALLEL_FROM = 256
#: The fewest ranks a recording process takes (fewer ranks: fewer processes).
SHARE_MIN = 64
#: The most recording processes by default: each holds an in-process team of all the ranks (0.14 GB
#: at 65,536) beside its share of the programs.
MAX_DEFAULT_JOBS = 8


def default_jobs() -> int:
    """The processes that record programs side by side by default: the cores this process may
    run on, at most :data:`MAX_DEFAULT_JOBS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - (not Linux)
        cores = os.cpu_count() or 1
    return min(cores, MAX_DEFAULT_JOBS)


def programs(coll: str, algorithm: str, size: int, nbytes: int, dtype: Any = "float32", op: str = "sum",
             root: int = 0, progress: Optional[Callable[[int], None]] = None,
             jobs: Optional[int] = None) -> List[Compact]:
    """Every rank's program of ``coll`` by ``algorithm`` on ``size`` ranks for a call of ``nbytes``
    (see the module doc), rank 0 first, in the simulator's compact form. From
    :data:`PARALLEL_FROM` ranks, up to ``jobs`` processes (default: :func:`default_jobs`; each
    takes :data:`SHARE_MIN` ranks or more) record them side by side, each its own share of the
    ranks: the same programs, only sooner (:func:`may_fork` says where they cannot).
    ``progress(rank)`` is called for each rank once its program is in (a share at a time)."""
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    parts = COMPOSITES.get((coll, algorithm))
    if parts is not None:  # the parts one after the other, the second's steps after every rank's first
        (c1, a1), (c2, a2) = parts
        first = programs(c1, a1, size, nbytes, dtype, op, root, None, jobs)
        second = programs(c2, a2, size, nbytes, dtype, op, root, progress, jobs)
        offset = max((max(x.steps, default=-1) for x in first), default=-1) + 1
        return [chain(x, y, offset) for x, y in zip(first, second)]
    jobs = min(jobs, size // SHARE_MIN)
    if jobs <= 1 or size < PARALLEL_FROM or not may_fork():
        return _record_ranks(coll, algorithm, size, nbytes, dtype, op, root, 0, size, progress)
    cuts = [size * k // jobs for k in range(jobs + 1)]
    shares = [(coll, algorithm, size, nbytes, dtype, op, root, lo, hi) for lo, hi in zip(cuts, cuts[1:])]
    return _record_in_processes(shares, progress)


def may_fork() -> bool:
    """Whether programs may be recorded in child processes here: the platform forks, no other
    thread runs (a fork copies them in whatever state they are in) and this process is not a
    daemonic worker of ``multiprocessing`` (which may start none)."""
    return ("fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1
            and not multiprocessing.current_process().daemon)


def _record_in_processes(shares: List[tuple], progress: Optional[Callable[[int], None]]) -> List[Compact]:
    """The programs of every share (``_record_ranks``' arguments but progress), each recorded by a
    forked process of its own that sends them back through a pipe, in order. A process that fails
    sends its exception, raised here; one that ends without sending raises RuntimeError; whatever
    interrupts this (Ctrl-C: the processes ignore it) ends the processes still running."""
    fork = multiprocessing.get_context("fork")
    workers = []
    try:
        for share in shares:
            receive, send = fork.Pipe(duplex=False)
            worker = fork.Process(target=_record_share, args=(send, share), daemon=True)
            worker.start()
            send.close()  # (the child's end alone stays open: its exit ends the pipe)
            workers.append((worker, receive, share))
        out: List[Compact] = []
        for worker, receive, share in workers:
            lo, hi = share[-2:]
            try:
                ok, got = receive.recv()
            except EOFError:
                worker.join()
                raise RuntimeError(f"pycoll.sim: the process recording ranks {lo}-{hi - 1} ended "
                                   f"(exit code {worker.exitcode}) without their programs") from None
            if not ok:
                raise got
            out += got
            if progress is not None:
                for rank in range(lo, hi):
                    progress(rank)
        return out
    finally:
        for worker, receive, _ in workers:
            if worker.is_alive():
                worker.terminate()
            worker.join()
            receive.close()


def _record_share(send: Any, share: tuple) -> None:
    """A recording process: the programs of its share of the ranks (or the exception that stopped
    it) into ``send``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C: the parent ends its processes)
    try:
        result: tuple = (True, _record_ranks(*share))
    except Exception as exc:  # (sent to the parent, which raises it)
        result = (False, exc)
    send.send(result)
    send.close()


def _record_ranks(coll: str, algorithm: str, size: int, nbytes: int, dtype: Any, op: str, root: int,
                  lo: int, hi: int, progress: Optional[Callable[[int], None]] = None) -> List[Compact]:
    """The compact programs of ranks ``lo`` to ``hi - 1`` (of ``size``), recorded in this process."""
    dt = np.dtype(dtype)
    count = elements(coll, nbytes, size, dt.itemsize)
    teams = local_teams(size)
    out = []
    try:
        for team in teams[lo:hi]:
            call = _call(team, coll, count, dt, op, root)
            out.append(Compact.of(record(team, call, algorithm, compute=False, sizes_only=True)))
            if progress is not None:
                progress(team.rank)
    finally:
        for team in teams:
            team.close()
    return out
