"""Lowering, checked: :func:`lower` records an algorithm on every rank of an in-process team
(:mod:`pycoll.lower.record`), checks the programs as a set, and runs them against the algorithm
on the same inputs: :class:`~pycoll.lower.record.NotLowerable` unless every rank's output has the
same bits.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from pycoll.lower.execute import run_program
from pycoll.lower.program import Program, check_set
from pycoll.lower.record import LOWERED, NotLowerable, record
from pycoll.team import local_teams


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


def inputs(rank: int, coll: str, size: int, count: int, dtype: Any, seed: int,
           n: Optional[int] = None) -> np.ndarray:
    """Rank ``rank``'s input for a lowering check: small integers (exact in any order), distinct
    per rank and per seed (``n`` of them: by default ``count``, or a block per rank)."""
    if n is None:
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
    if coll in ("scan", "exscan"):
        return team.call(coll, x, np.zeros_like(x), op)
    return _v_call(team, coll, count, dtype, op, root, seed)


def v_counts(size: int, count: int, rank: int = 0) -> List[int]:
    """The blocks of a v-collective's lowering check: about ``count`` elements each, unequal,
    some empty (row ``rank`` of alltoallv's matrix)."""
    return [max(0, count + (rank + 2 * j) % 3 - 1) for j in range(size)]


def v_displs(counts: Sequence[int]) -> List[int]:
    """Displacements of ``counts`` with a one-element gap after each block (left untouched)."""
    return [sum(counts[:j]) + j for j in range(len(counts))]


def _v_call(team: Any, coll: str, count: int, dtype: Any, op: Any, root: int, seed: int) -> Any:
    """The checked v-collective call of :func:`make_call` (every rank given the counts, so that
    the algorithms that need them everywhere lower too)."""
    n, r = team.size, team.rank
    counts = v_counts(n, count)
    displs = v_displs(counts)
    room = displs[-1] + counts[-1] + 1 if n else 0

    def x(k: int) -> np.ndarray:
        return inputs(r, coll, n, count, dtype, seed, k)

    if coll == "allgatherv":
        return team.call(coll, x(counts[r]), np.zeros(room, dtype), counts, displs)
    if coll == "reduce_scatterv":
        return team.call(coll, x(sum(counts)), np.zeros(counts[r], dtype), counts, op)
    if coll == "alltoallv":
        sc = v_counts(n, count, r)
        rc = [v_counts(n, count, j)[r] for j in range(n)]
        sd, rd = v_displs(sc), v_displs(rc)
        return team.call(coll, x(sd[-1] + sc[-1] + 1), np.zeros(rd[-1] + rc[-1] + 1, dtype), sc, rc, sd, rd)
    whole = np.zeros(room, dtype) if r == root else None  # (gatherv's recvbuf, scatterv's sendbuf)
    if coll == "gatherv":
        return team.call(coll, x(counts[r]), whole, counts, displs, root)
    if coll == "scatterv":
        src = None if whole is None else x(room)
        return team.call(coll, src, np.zeros(counts[r], dtype), counts, displs, root)
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
        if (coll in ("reduce", "gather", "gatherv") and r != root) or (coll == "exscan" and r == 0):
            continue  # (no output there; exscan's rank 0 is left undefined, as in MPI)
        if want.tobytes() != got.tobytes():
            raise NotLowerable(f"{coll}:{algorithm} computes in ways the recording does not see: rank {r}'s "
                               "output from its program differs from the algorithm's")
