"""The collective matrix: every collective x every registered algorithm x dtype x op x counts x
in place x persistent (started 3 times, refilled in between) x root, checked against numpy.

The same driver runs on in-process teams (all ranks here) and in real processes (one rank per
process): inputs depend only on (rank, case, start), so every process knows every rank's input
and computes the expected output itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Iterator, List, Tuple

import numpy as np

import pycoll
from pycoll.algorithms import ALGORITHMS
from pycoll.ops import DTYPES, ReduceOp
from tests.colltest import ALL_DTYPES, assert_same, expected, make_input, valid_ops

REDUCING = ("allreduce", "reduce", "reduce_scatter", "reduce_scatterv")
ROOTED = ("bcast", "reduce", "gather", "gatherv", "scatter", "scatterv")
IN_PLACE = ("allreduce", "reduce", "allgather", "allgatherv", "gather", "gatherv", "scatter", "scatterv")


@dataclass(frozen=True)
class Case:
    coll: str
    alg: str
    dtype: str
    op: ReduceOp
    count: int
    in_place: bool
    persistent: bool
    root: int

    def __str__(self) -> str:
        return (f"{self.coll}:{self.alg} {self.dtype} {self.op.name} count={self.count} root={self.root}"
                f"{' in-place' if self.in_place else ''}{' persistent' if self.persistent else ''}")


def cases(n: int, shared: bool, large: int, dtypes: bool = True, thin: bool = False,
          cma: bool = False) -> Iterator[Case]:
    """The matrix for a team of ``n``; ``shared``: the team has a shared segment (shm algorithms
    run); ``dtypes``: sweep every dtype x op of the reducing collectives (else float32 SUM only);
    ``thin`` (large teams): counts 0, odd and large, persistent only for the odd count."""
    roots = sorted({0, n // 2, n - 1})
    for coll in ALGORITHMS:
        for alg in ALGORITHMS[coll]:
            if (alg == "shm" and not shared) or (alg == "cma" and not cma):
                continue
            if coll in REDUCING and dtypes:
                for dtype in ALL_DTYPES:
                    for op in valid_ops(dtype):
                        yield Case(coll, alg, dtype, op, 7, False, False, n - 1)
            dtype = "float32" if coll in REDUCING else "int16"
            for count in ((0, 7, large) if thin else (0, 1, 7, large)):
                for root in (roots if coll in ROOTED else [0]):
                    for in_place in ((False, True) if coll in IN_PLACE else (False,)):
                        for persistent in (False, True):
                            if (coll == "barrier" and count) or (thin and persistent and count != 7):
                                continue
                            yield Case(coll, alg, dtype, ReduceOp.SUM, count, in_place, persistent, root)


def vlayout(n: int, c: int) -> tuple:
    """Unequal blocks (some empty) placed in reverse rank order with one-element gaps:
    (counts, displs, room)."""
    counts = [c if r % 3 == 0 else (c // 2 if r % 3 == 1 else 0) for r in range(n)]
    displs = [0] * n
    at = 1
    for r in reversed(range(n)):
        displs[r] = at
        at += counts[r] + 1
    return counts, displs, at


@lru_cache(maxsize=64)
def a2a_counts(n: int, c: int) -> Tuple[Tuple[int, ...], ...]:
    """alltoallv: ``s[i][j]`` elements go from rank i to rank j."""
    return tuple(tuple((i + 2 * j) % 3 * c // 2 for j in range(n)) for i in range(n))


def data(case: Case, r: int, m: int, start: int) -> np.ndarray:
    """Rank ``r``'s input of ``m`` elements for run ``start`` of ``case``."""
    if case.coll in REDUCING:
        return make_input(case.dtype, case.op, r, m, seed=start + 1)
    return ((np.arange(m) + 97 * r + 31 * start) % 30000).astype(DTYPES[case.dtype])


class Rank:
    """One rank's buffers, call and check of one case."""

    def __init__(self, team: pycoll.Team, case: Case, shared_inputs: dict) -> None:
        self.team, self.case = team, case
        self._inputs = shared_inputs  # start -> every rank's input, shared by the ranks here
        n, r, c, coll = team.size, team.rank, case.count, case.coll
        dt = DTYPES[case.dtype]
        self.counts, self.displs, self.room = vlayout(n, c)
        if coll == "reduce_scatterv":
            self.displs, self.room = list(np.cumsum([0] + self.counts[:-1])), sum(self.counts)
        self.a2a = a2a_counts(n, c)
        z = np.zeros
        self.src: np.ndarray = z(0, dt)
        self.dst: np.ndarray = z(0, dt)
        if coll in ("allreduce", "reduce"):
            self.src, self.dst = z(c, dt), z(c, dt)
        elif coll == "bcast":
            self.dst = z(c, dt)
        elif coll in ("allgather", "gather"):
            self.src, self.dst = z(c, dt), z(n * c, dt)
        elif coll in ("allgatherv", "gatherv"):
            self.src, self.dst = z(self.counts[r], dt), z(self.room, dt)
        elif coll == "reduce_scatter":
            self.src, self.dst = z(n * c, dt), z(c, dt)
        elif coll == "reduce_scatterv":
            self.src, self.dst = z(self.room, dt), z(self.counts[r], dt)
        elif coll == "alltoall":
            self.src, self.dst = z(n * c, dt), z(n * c, dt)
        elif coll == "alltoallv":
            self.src = z(sum(self.a2a[r]), dt)
            self.dst = z(sum(row[r] for row in self.a2a), dt)
        elif coll == "scatter":
            self.src, self.dst = z(n * c, dt), z(c, dt)
        elif coll == "scatterv":
            self.src, self.dst = z(self.room, dt), z(self.counts[r], dt)

    def inputs(self, start: int) -> List[np.ndarray]:
        """Every rank's input of run ``start`` (the check needs them all)."""
        got = self._inputs.get(start)
        if got is None:
            got = self._inputs[start] = self._make_inputs(start)
        return got

    def _make_inputs(self, start: int) -> List[np.ndarray]:
        case, n, c = self.case, self.team.size, self.case.count
        coll = case.coll
        if coll in ("allgatherv", "gatherv"):
            return [data(case, r, self.counts[r], start) for r in range(n)]
        if coll in ("reduce_scatter", "alltoall"):
            return [data(case, r, n * c, start) for r in range(n)]
        if coll == "reduce_scatterv":
            return [data(case, r, self.room, start) for r in range(n)]
        if coll == "alltoallv":
            return [data(case, r, sum(self.a2a[r]), start) for r in range(n)]
        if coll in ("scatter", "scatterv"):
            return [data(case, case.root, self.src.size, start)] * n
        return [data(case, r, c, start) for r in range(n)]

    def fill(self, start: int) -> None:
        """Write this rank's input for run ``start`` where the collective reads it."""
        case, r, coll = self.case, self.team.rank, self.case.coll
        mine = self.inputs(start)[r]
        self.dst[...] = 0
        if coll == "bcast":
            if r == case.root:
                self.dst[:] = mine
        elif case.in_place and coll in ("allreduce",):
            self.dst[:] = mine
        elif case.in_place and coll == "reduce" and r == case.root:
            self.dst[:] = mine
        elif case.in_place and coll in ("allgather", "gather") and (coll == "allgather" or r == case.root):
            self.dst[r * case.count:(r + 1) * case.count] = mine
        elif case.in_place and coll in ("allgatherv", "gatherv") and (coll == "allgatherv" or r == case.root):
            self.dst[self.displs[r]:self.displs[r] + self.counts[r]] = mine
        else:
            self.src[:] = mine if self.src.size else self.src

    def call(self, persistent: bool):
        """Start the collective (``persistent``: make the persistent one and return it)."""
        case, team, r = self.case, self.team, self.team.rank
        coll, root, ip = case.coll, case.root, case.in_place
        kw = {"algorithm": case.alg}
        at_root = r == root
        name = coll + ("_init" if persistent else "")
        fn = getattr(team, name)
        if coll == "allreduce":
            return fn(self.dst, None, case.op, **kw) if ip else fn(self.src, self.dst, case.op, **kw)
        if coll == "bcast":
            return fn(self.dst, root, **kw)
        if coll == "barrier":
            return fn(**kw)
        if coll == "reduce":
            if ip and at_root:
                return fn(self.dst, None, case.op, root, **kw)
            return fn(self.src, self.dst if at_root else None, case.op, root, **kw)
        if coll == "allgather":
            return fn(None if ip else self.src, self.dst, **kw)
        if coll == "allgatherv":
            return fn(None if ip else self.src, self.dst, self.counts, self.displs, **kw)
        if coll == "reduce_scatter":
            return fn(self.src, self.dst, case.op, **kw)
        if coll == "reduce_scatterv":
            return fn(self.src, self.dst, self.counts, case.op, **kw)
        if coll == "alltoall":
            return fn(self.src, self.dst, **kw)
        if coll == "alltoallv":
            send = list(self.a2a[r])
            recv = [row[r] for row in self.a2a]
            return fn(self.src, self.dst, send, recv, **kw)
        if coll == "gather":
            return fn(None if ip and at_root else self.src, self.dst if at_root else None, root, **kw)
        if coll == "gatherv":
            return fn(None if ip and at_root else self.src, self.dst if at_root else None, self.counts,
                      self.displs, root, **kw)
        if coll == "scatter":
            return fn(self.src if at_root else None, None if ip and at_root else self.dst, root, **kw)
        if coll == "scatterv":
            return fn(self.src if at_root else None, None if ip and at_root else self.dst, self.counts,
                      self.displs, root, **kw)
        raise AssertionError(coll)

    def check(self, start: int) -> None:
        case, n, r, c = self.case, self.team.size, self.team.rank, self.case.count
        coll, root, ins = case.coll, case.root, self.inputs(start)
        what = f"{case} run {start} rank {r}"
        if coll == "allreduce":
            assert_same([self.dst], expected(ins, case.op), what)
        elif coll == "bcast":
            assert np.array_equal(self.dst, ins[root]), what
        elif coll == "reduce":
            if r == root:
                assert_same([self.dst], expected(ins, case.op), what)
            elif not case.in_place:
                assert np.array_equal(self.src, ins[r]), what + " (input changed)"
        elif coll in ("allgather", "gather"):
            if coll == "allgather" or r == root:
                assert np.array_equal(self.dst, np.concatenate(ins)), what
        elif coll in ("allgatherv", "gatherv"):
            if coll == "allgatherv" or r == root:
                want = np.zeros(self.room, self.dst.dtype)
                for rr in range(n):
                    want[self.displs[rr]:self.displs[rr] + self.counts[rr]] = ins[rr]
                assert np.array_equal(self.dst, want), what
        elif coll in ("reduce_scatter", "reduce_scatterv"):
            full = expected(ins, case.op)
            lo = r * c if coll == "reduce_scatter" else self.displs[r]
            assert_same([self.dst], full[lo:lo + self.dst.size], what)
        elif coll == "alltoall":
            want = np.concatenate([ins[i][r * c:(r + 1) * c] for i in range(n)])
            assert np.array_equal(self.dst, want), what
        elif coll == "alltoallv":
            parts = []
            for i in range(n):
                off = sum(self.a2a[i][:r])
                parts.append(ins[i][off:off + self.a2a[i][r]])
            assert np.array_equal(self.dst, np.concatenate(parts)), what
        elif coll in ("scatter", "scatterv"):
            lo = r * c if coll == "scatter" else self.displs[r]
            cnt = c if coll == "scatter" else self.counts[r]
            got = self.src[lo:lo + cnt] if case.in_place and r == root else self.dst
            assert np.array_equal(got, ins[root][lo:lo + cnt]), what


def run(teams: List[pycoll.Team], case: Case) -> None:
    """Run ``case`` on ``teams`` (the ranks living in this process) and check every output."""
    shared: dict = {}
    ranks = [Rank(t, case, shared) for t in teams]
    if not case.persistent:
        for rk in ranks:
            rk.fill(0)
        pycoll.wait_all([rk.call(False) for rk in ranks])
        for rk in ranks:
            rk.check(0)
        return
    plans = [rk.call(True) for rk in ranks]
    for start in range(3):
        for rk in ranks:
            rk.fill(start)
        pycoll.wait_all([p.start() for p in plans])
        for rk in ranks:
            rk.check(start)
    for p in plans:
        p.free()


def run_all(teams: List[pycoll.Team], n: int, shared: bool, large: int, dtypes: bool = True,
            thin: bool = False, cma: bool = False) -> Dict[str, int]:
    """Every case for a team of ``n``; returns how many ran per collective."""
    done: Dict[str, int] = {}
    for case in cases(n, shared, large, dtypes, thin, cma):
        try:
            run(teams, case)
        except Exception as exc:
            raise AssertionError(f"{case} on {n} ranks: {exc!r}") from exc
        done[case.coll] = done.get(case.coll, 0) + 1
    return done
