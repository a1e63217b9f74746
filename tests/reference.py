"""What a correct collective produces, computed with numpy: the one reference of the tests.

Used in process by the unit and coll tests and by the scripts that the launchers start under
mpiexec (they import it as ``tests.reference``; PYTHONPATH is the checkout). Four parts:

* inputs and checks: :func:`make_input` (inputs whose reductions are exact in every dtype),
  :func:`expected` (the reduction of every rank's input), :func:`assert_same`, :func:`valid_ops`;
* :func:`result`: what one rank holds after any collective, given every rank's input;
* the collective matrix (:func:`matrix_cases`, :func:`run_matrix`): every collective x every
  registered algorithm x dtype x op x counts x in place x persistent x root;
* mixed collectives (:func:`mixed_plan`, :func:`post_mixed`, :func:`check_mixed`): many collectives
  of every kind in flight at once, each result known in closed form.

Inputs depend only on (rank, case, start), so every process knows every rank's input and computes
the expected output itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

import pycoll
from pycoll.algorithms import ALGORITHMS
from pycoll.ops import _VALID, DTYPES, ReduceOp, _kind
from pycoll.ops import reference as reduce_reference

ALL_DTYPES = list(DTYPES)


# ------------------------------------------------------------------ inputs and checks
def valid_ops(dtype):
    """The ops that apply to ``dtype`` (a name)."""
    return [op for op in ReduceOp if op in _VALID[_kind(np.dtype(DTYPES[dtype]))]]


def make_input(dtype, op, rank, count, seed=0):
    """Rank ``rank``'s input: small integers (exact in float16/bfloat16 sums of up to 64 ranks),
    +-1 and 1/2 for products, random bits for bitwise ops, booleans for bool."""
    dt = DTYPES[dtype]
    rng = np.random.default_rng(seed * 1000 + rank)
    if dt == np.bool_:
        return rng.random(count) < 0.5
    if op in (ReduceOp.PROD,):
        vals = rng.choice([1, 1, 1, -1, 2] if dt.kind != "u" else [1, 1, 1, 2], count)
        if dt.kind in "iu" and dt.itemsize == 1:
            vals = rng.choice([1, 1, 1, -1] if dt.kind == "i" else [1], count)
        arr = vals.astype(dt) if dt.kind != "c" else (vals + 0j).astype(dt)
        return arr
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR, ReduceOp.LAND, ReduceOp.LOR, ReduceOp.LXOR):
        hi = min(np.iinfo(dt).max, 1 << 16) if dt.kind in "iu" else 2
        return rng.integers(0, hi, count).astype(dt)
    lo, hi = (-3, 4) if dt.kind in "ifc" or dtype in ("bfloat16",) else (0, 4)
    vals = rng.integers(lo, hi, count)
    if dt.kind == "c":
        return (vals + 1j * rng.integers(lo, hi, count)).astype(dt)
    return vals.astype(dt)


def expected(inputs, op):
    """The reduction of every rank's input (``inputs[r]``) by ``op``, as pycoll defines it."""
    return reduce_reference([x.copy() for x in inputs], op)


def assert_same(outputs, want, what=""):
    """Assert that every output equals ``want`` (floats compared as float64, NaN equal to NaN)."""
    for r, out in enumerate(outputs):
        got = np.asarray(out)
        if got.dtype.kind == "f" or got.dtype.name == "bfloat16":
            ok = np.array_equal(got.astype(np.float64), want.astype(np.float64), equal_nan=True)
        else:
            ok = np.array_equal(got, want)
        assert ok, f"{what}: rank {r} differs: got {got[:8]} want {want[:8]}"


# ------------------------------------------------------------------ every collective's result
def result(coll: str, ins: Sequence[np.ndarray], rank: int, *, op: ReduceOp = ReduceOp.SUM, root: int = 0,
           count: Optional[int] = None, counts: Optional[Sequence[int]] = None,
           displs: Optional[Sequence[int]] = None, room: Optional[int] = None,
           sends: Optional[Sequence[Sequence[int]]] = None) -> Optional[np.ndarray]:
    """What ``rank`` holds after ``coll`` when rank i's input is ``ins[i]`` (for scatter(v): the
    root's send buffer is ``ins[root]``); None where the collective defines nothing (barrier, a
    reduce or gather away from its root).

    Block collectives take ``count`` (elements per block; default: the input split in n blocks);
    v-forms ``counts`` and ``displs`` (default: packed) and, for allgatherv/gatherv, ``room`` (the
    receive buffer's length; default: just enough); alltoallv ``sends[i][j]``, the elements that go
    from rank i to rank j."""
    n = len(ins)
    if coll in ("allgatherv", "gatherv", "reduce_scatterv", "scatterv") and displs is None:
        displs = [int(x) for x in np.cumsum([0, *counts[:-1]])]
    if coll == "barrier" or (coll in ("reduce", "gather", "gatherv") and rank != root):
        return None
    if coll in ("allreduce", "reduce"):
        return expected(ins, op)
    if coll == "scan":
        return expected(ins[:rank + 1], op)
    if coll == "exscan":  # (rank 0's output is left as it was)
        return expected(ins[:rank], op) if rank else None
    if coll == "bcast":
        return ins[root]
    if coll in ("allgather", "gather"):
        return np.concatenate(ins)
    if coll in ("allgatherv", "gatherv"):
        if room is None:
            room = max((d + c for d, c in zip(displs, counts)), default=0)
        want = np.zeros(room, ins[0].dtype)
        for rr in range(n):
            want[displs[rr]:displs[rr] + counts[rr]] = ins[rr]
        return want
    if coll in ("reduce_scatter", "reduce_scatterv"):
        full = expected(ins, op)
        if coll == "reduce_scatter":
            c = full.size // n if count is None else count
            return full[rank * c:rank * c + c]
        return full[displs[rank]:displs[rank] + counts[rank]]
    if coll == "alltoall":
        c = ins[0].size // n if count is None else count
        return np.concatenate([ins[i][rank * c:(rank + 1) * c] for i in range(n)])
    if coll == "alltoallv":
        parts = []
        for i in range(n):
            off = sum(sends[i][:rank])
            parts.append(ins[i][off:off + sends[i][rank]])
        return np.concatenate(parts)
    if coll == "scatter":
        c = ins[root].size // n if count is None else count
        return ins[root][rank * c:(rank + 1) * c]
    if coll == "scatterv":
        return ins[root][displs[rank]:displs[rank] + counts[rank]]
    raise ValueError(f"no reference for {coll!r}")


# ------------------------------------------------------------------ the collective matrix
REDUCING = ("allreduce", "reduce", "reduce_scatter", "reduce_scatterv", "scan", "exscan")
ROOTED = ("bcast", "reduce", "gather", "gatherv", "scatter", "scatterv")
IN_PLACE = ("allreduce", "reduce", "allgather", "allgatherv", "gather", "gatherv", "scatter", "scatterv",
            "scan", "exscan")


@dataclass(frozen=True)
class Case:
    """One cell of the matrix."""

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


def matrix_cases(n: int, shared: bool, large: int, dtypes: bool = True, thin: int = 0,
                 cma: bool = False) -> Iterator[Case]:
    """The matrix for a team of ``n``; ``shared``: the team has a shared segment (shm algorithms
    run); ``dtypes``: sweep every dtype x op of the reducing collectives (else float32 SUM only);
    ``thin`` (large teams): 1: counts 0, odd and large, persistent only for the odd count; 2: that,
    with one root (the middle rank: relative ranks wrap) instead of three, in place only for the
    odd count; 3: that, with the large count and the persistent form only for the algorithms on
    the shared segment (shm, cma): the point-to-point ones do the same steps at every team size;
    4: that, with the point-to-point algorithms at the odd count only (count 0 ends before any
    step, whatever the team size); 5: the algorithms on the shared segment only, no count 0
    (it takes no generation on the segment, whatever the team size) and no scan."""
    roots = [n // 2] if thin >= 2 else sorted({0, n // 2, n - 1})
    for coll in ALGORITHMS:
        for alg in ALGORITHMS[coll]:
            if (alg == "shm" and not shared) or (alg == "cma" and not cma) or alg == "mapped":
                continue  # (mapped: arrays of team.alloc, tests/coll/scripts/mapped_allreduce.py)
            if thin and coll in ("scan", "exscan") and (alg != "shm" or thin >= 5):
                continue  # (point to point, the same steps at every size: covered up to 9 ranks)
            # (rd's dtypes and ops: test_scan_local; the segment's reduce natively: swept here)
            if coll in REDUCING and dtypes and (coll not in ("scan", "exscan") or alg == "shm"):
                for dtype in ALL_DTYPES:
                    for op in valid_ops(dtype):
                        if op is not ReduceOp.AVG or coll not in ("scan", "exscan"):
                            yield Case(coll, alg, dtype, op, 7, False, False, n - 1)
            dtype = "float32" if coll in REDUCING else "int16"
            for count in ((0, 7, large) if thin else (0, 1, 7, large)):
                for root in (roots if coll in ROOTED else [0]):
                    for in_place in ((False, True) if coll in IN_PLACE else (False,)):
                        for persistent in (False, True):
                            if (coll == "barrier" and count) or (thin and persistent and count != 7):
                                continue
                            if thin >= 2 and in_place and count != 7:
                                continue
                            if thin >= 3 and alg not in ("shm", "cma") and (persistent or count == large):
                                continue
                            if thin >= 4 and alg not in ("shm", "cma") and count != 7:
                                continue
                            if thin >= 5 and (alg not in ("shm", "cma") or count == 0):
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


class MatrixRank:
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
        if coll in ("allreduce", "reduce", "scan", "exscan"):
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
        elif case.in_place and coll in ("allreduce", "scan", "exscan"):
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
        if coll in ("allreduce", "scan", "exscan"):
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
        """Assert that this rank's output of run ``start`` is :func:`result`'s."""
        case, r = self.case, self.team.rank
        coll, root, ins = case.coll, case.root, self.inputs(start)
        what = f"{case} run {start} rank {r}"
        want = result(coll, ins, r, op=case.op, root=root, count=case.count, counts=self.counts,
                      displs=self.displs, room=self.room, sends=self.a2a)
        if want is None:  # barrier, or a rooted collective away from its root
            if coll == "reduce" and not case.in_place:
                assert np.array_equal(self.src, ins[r]), what + " (input changed)"
        elif coll in REDUCING:
            assert_same([self.dst], want, what)
        elif coll in ("scatter", "scatterv") and case.in_place and r == root:
            lo = r * case.count if coll == "scatter" else self.displs[r]
            assert np.array_equal(self.src[lo:lo + want.size], want), what
        else:
            assert np.array_equal(self.dst, want), what


def run_case(teams: List[pycoll.Team], case: Case) -> None:
    """Run ``case`` on ``teams`` (the ranks living in this process) and check every output."""
    shared: dict = {}
    ranks = [MatrixRank(t, case, shared) for t in teams]
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


def run_matrix(teams: List[pycoll.Team], n: int, shared: bool, large: int, dtypes: bool = True,
            thin: int = 0, cma: bool = False) -> Dict[str, int]:
    """Every case for a team of ``n``; returns how many ran per collective."""
    done: Dict[str, int] = {}
    for case in matrix_cases(n, shared, large, dtypes, thin, cma):
        try:
            run_case(teams, case)
        except Exception as exc:
            raise AssertionError(f"{case} on {n} ranks: {exc!r}") from exc
        done[case.coll] = done.get(case.coll, 0) + 1
    return done


# ------------------------------------------------------------------ mixed collectives
# Collective k of a plan, posted and checked on any team (in-process or one rank of a process job).
# Every rank computes the same plan; inputs depend on (rank, k) so that every result is known in
# closed form.
MIXED_KINDS = ["allreduce", "bcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather",
               "scatter", "barrier", "allgatherv", "reduce_scatterv", "alltoallv", "gatherv", "scatterv"]


def mixed_plan(total=1000, seed=7):
    """``total`` (kind, count) pairs, the same on every rank."""
    rng = np.random.default_rng(seed)
    sizes = [1, 3, 100, 2000]
    return [(MIXED_KINDS[int(rng.integers(0, len(MIXED_KINDS)))], int(rng.choice(sizes)))
            for _ in range(total)]


def mixed_vcounts(n, k, count):
    """Unequal counts of a v-collective: rank r's block holds (r + k) % 3 * count // 2 elements."""
    return [(r + k) % 3 * count // 2 for r in range(n)]


def post_mixed(team, kind, k, count, bufs, tagged=True, priority=None):
    """Start collective ``k`` on ``team``; its output buffer goes to ``bufs[k]``."""
    n, r = team.size, team.rank
    if priority is None:
        priority = int(np.random.default_rng(1000 * r + k).integers(0, 8))
    kw = {"tag": ("t", k) if tagged else None, "priority": priority}
    root = k % n
    if kind == "allreduce":
        bufs[k] = np.full(count, float(r + k))
        return team.allreduce(bufs[k], **kw)
    if kind == "bcast":
        bufs[k] = np.full(count, float(k) if r == root else -1.0)
        return team.bcast(bufs[k], root=root, **kw)
    if kind == "reduce":
        bufs[k] = np.zeros(count)
        return team.reduce(np.full(count, float(r + k)), bufs[k], root=root, **kw)
    if kind == "allgather":
        bufs[k] = np.zeros(n * count)
        return team.allgather(np.full(count, float(r + k)), bufs[k], **kw)
    if kind == "reduce_scatter":
        bufs[k] = np.zeros(count)
        return team.reduce_scatter(np.full(n * count, float(r + k)), bufs[k], **kw)
    if kind == "alltoall":
        bufs[k] = np.zeros(n * count)
        return team.alltoall(np.repeat(np.arange(n, dtype=float) + 10 * r + k, count), bufs[k], **kw)
    if kind == "gather":
        bufs[k] = np.zeros(n * count)
        return team.gather(np.full(count, float(r + k)), bufs[k] if r == root else None, root=root, **kw)
    if kind == "scatter":
        bufs[k] = np.zeros(count)
        whole = np.repeat(np.arange(n, dtype=float) + k, count) if r == root else None
        return team.scatter(whole, bufs[k], root=root, **kw)
    counts = mixed_vcounts(n, k, count)
    if kind == "allgatherv":
        bufs[k] = np.zeros(sum(counts))
        return team.allgatherv(np.full(counts[r], float(r + k)), bufs[k], counts, **kw)
    if kind == "reduce_scatterv":
        bufs[k] = np.zeros(counts[r])
        return team.reduce_scatterv(np.full(sum(counts), float(r + k)), bufs[k], counts, **kw)
    if kind == "alltoallv":  # rank i sends counts[j] elements valued 10 i + j + k to rank j
        send = [counts[j] for j in range(n)]
        recv = [counts[r]] * n
        bufs[k] = np.zeros(sum(recv))
        return team.alltoallv(np.repeat(np.arange(n, dtype=float) + 10 * r + k, send), bufs[k], send, recv,
                              **kw)
    if kind == "gatherv":
        bufs[k] = np.zeros(sum(counts))
        return team.gatherv(np.full(counts[r], float(r + k)), bufs[k] if r == root else None,
                            counts if r == root else None, root=root, **kw)
    if kind == "scatterv":
        bufs[k] = np.zeros(counts[r])
        whole = np.repeat(np.arange(n, dtype=float) + k, counts) if r == root else None
        return team.scatterv(whole, bufs[k], counts if r == root else None, root=root, **kw)
    bufs[k] = None
    return team.barrier(**kw)


def check_mixed(team, kind, k, count, buf):
    """Assert that collective ``k``'s output on this rank is right."""
    n, r = team.size, team.rank
    root = k % n
    total = sum(rr + k for rr in range(n))
    counts = mixed_vcounts(n, k, count)
    if kind in ("allreduce", "reduce_scatter", "reduce_scatterv") or (kind == "reduce" and r == root):
        want = total
    elif kind == "bcast":
        want = k
    elif kind in ("allgather", "gather"):
        want = np.repeat(np.arange(n, dtype=float) + k, count)
    elif kind in ("allgatherv", "gatherv"):
        want = np.repeat(np.arange(n, dtype=float) + k, counts)
    elif kind == "alltoall":
        want = np.repeat(np.arange(n, dtype=float) * 10 + r + k, count)
    elif kind == "alltoallv":
        want = np.repeat(np.arange(n, dtype=float) * 10 + r + k, counts[r])
    elif kind in ("scatter", "scatterv"):
        want = r + k
    else:
        return
    if kind in ("gather", "gatherv") and r != root:
        return
    assert np.array_equal(buf, np.broadcast_to(want, buf.shape)), (kind, k, count, r)
