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
import threading
from array import array
from typing import Any, Callable, List, Optional

import numpy as np

from pycoll.lower.record import NotLowerable, record
from pycoll.sim.engine import Compact, edges_csr
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


def chain(a: Compact, b: Compact) -> Compact:
    """``a`` then ``b`` on one rank: ``b``'s first instructions wait for ``a``'s last; ``b``'s
    steps are numbered after ``a``'s (their messages never match each other's)."""
    n, m = len(a.kinds), len(b.kinds)
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


#: The fewest ranks whose programs are recorded by several processes (below, one process is quicker).
PARALLEL_FROM = 256


def default_jobs() -> int:
    """The processes that record programs side by side: the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - (not Linux)
        return os.cpu_count() or 1


def programs(coll: str, algorithm: str, size: int, nbytes: int, dtype: Any = "float32", op: str = "sum",
             root: int = 0, progress: Optional[Callable[[int], None]] = None,
             jobs: Optional[int] = None) -> List[Compact]:
    """Every rank's program of ``coll`` by ``algorithm`` on ``size`` ranks for a call of ``nbytes``
    (see the module doc), rank 0 first, in the simulator's compact form. From
    :data:`PARALLEL_FROM` ranks, ``jobs`` processes (default: :func:`default_jobs`) record them side
    by side, each its own share of the ranks (the same programs: only the wall time changes; not
    from a process that runs threads);
    ``progress(rank)`` is called as each rank's program is in."""
    jobs = default_jobs() if jobs is None else jobs
    # (fork: the workers start at once, with pycoll imported; not from a process with threads,
    # which a fork copies in whatever state they are)
    if (jobs <= 1 or size < PARALLEL_FROM or "fork" not in multiprocessing.get_all_start_methods()
            or threading.active_count() > 1):
        return _record_ranks(coll, algorithm, size, nbytes, dtype, op, root, 0, size, progress)
    # a share of the ranks per process, in order (each process makes the in-process team anew)
    cuts = [size * k // jobs for k in range(jobs + 1)]
    out: List[Compact] = []
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        shares = [(coll, algorithm, size, nbytes, dtype, op, root, lo, hi) for lo, hi in zip(cuts, cuts[1:])]
        for lo, part in zip(cuts, pool.imap(_record_share, shares)):
            out += part
            if progress is not None:
                for rank in range(lo, lo + len(part)):
                    progress(rank)
    return out


def _record_share(share: tuple) -> List[Compact]:
    """The programs of ranks ``lo``-``hi`` (a worker's share: see :func:`programs`)."""
    return _record_ranks(*share)


def _record_ranks(coll: str, algorithm: str, size: int, nbytes: int, dtype: Any, op: str, root: int,
                  lo: int, hi: int, progress: Optional[Callable[[int], None]] = None) -> List[Compact]:
    """The compact programs of ranks ``lo`` to ``hi - 1`` (of ``size``), recorded in this process."""
    parts = COMPOSITES.get((coll, algorithm))
    if parts is not None:
        first, second = (_record_ranks(c, a, size, nbytes, dtype, op, root, lo, hi) for c, a in parts)
        out = [chain(x, y) for x, y in zip(first, second)]
        if progress is not None:
            for rank in range(lo, hi):
                progress(rank)
        return out
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
