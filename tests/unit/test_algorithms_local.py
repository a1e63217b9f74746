"""The point-to-point block algorithms (allgather ``rd``/``bruck``, reduce_scatter ``rhalving``,
alltoall ``bruck``) on in-process teams against numpy: team sizes 1..9, 16, 33 (powers of two and
not), counts 0, 1, odd and 1000, dtypes and ops for the reduction, in place, v-layouts with gaps and
reversed displacements, persistent collectives. Over MPI in real processes:
tests/coll/test_algorithms_mpi.py."""

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, algorithms
from pycoll.algorithms.base import CollArgs, equal_layout
from pycoll.ops import DTYPES
from tests.reference import assert_same, expected, make_input, valid_ops

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33]
COUNTS = [0, 1, 7, 1000]
DTYPES_RS = ["float32", "int64", "bfloat16", "float16"]
OPS_RS = [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.PROD, ReduceOp.AVG]
ALLGATHER = ["rd", "bruck"]


def layouts(n):
    """(counts, displs) of v-collectives: unequal blocks with empty ones, all empty, gaps between
    blocks, blocks in reverse rank order."""
    counts = [(3 * k + 1) % 5 for k in range(n)]  # 1, 4, 2, 0, 3, ...
    yield counts, None
    yield [0] * n, None
    yield [k + 3 if k % 3 else 0 for k in range(n)], None  # rank 0 (and every third) empty
    yield counts, [sum(counts[:k]) + 5 * k + 2 for k in range(n)]  # gaps
    yield counts, [sum(counts[k + 1:]) for k in range(n)]  # reverse rank order


# ------------------------------------------------------------------ allgather(v)
@pytest.mark.parametrize("alg", ALLGATHER)
@pytest.mark.parametrize("n", SIZES)
def test_allgather(n, alg):
    teams = pycoll.local_teams(n)
    for count in COUNTS:
        for dtype in ("int64", "float16"):
            dt = DTYPES[dtype]
            ins = [make_input(dtype, ReduceOp.SUM, r, count, seed=count) for r in range(n)]
            want = np.concatenate(ins) if n * count else np.zeros(0, dt)
            outs = [np.full(n * count, 99, dt) for _ in range(n)]
            srcs = [x.copy() for x in ins]
            pycoll.wait_all([t.allgather(srcs[r], outs[r], algorithm=alg) for r, t in enumerate(teams)])
            assert_same(outs, want, f"allgather {alg} n={n} count={count} {dtype}")
            for r in range(n):
                assert np.array_equal(srcs[r], ins[r])  # inputs untouched
        # in place: each rank's block of recvbuf is its contribution
        outs = [np.full(n * count, -1, np.int64) for _ in range(n)]
        for r in range(n):
            outs[r][r * count:(r + 1) * count] = np.arange(count) + 100 * r
        want = np.concatenate([np.arange(count) + 100 * r for r in range(n)]) if n * count else np.zeros(0)
        pycoll.wait_all([t.allgather(None, outs[r], algorithm=alg) for r, t in enumerate(teams)])
        assert_same(outs, want, f"allgather in place {alg} n={n} count={count}")


@pytest.mark.parametrize("alg", ALLGATHER)
@pytest.mark.parametrize("n", SIZES)
def test_allgatherv_layouts(n, alg):
    teams = pycoll.local_teams(n)
    for counts, displs in layouts(n):
        offs = displs if displs is not None else [sum(counts[:k]) for k in range(n)]
        room = max([o + c for o, c in zip(offs, counts)] + [0]) + 3  # slack after the last block
        ins = [np.arange(counts[r], dtype=np.float32) + 1000 * r for r in range(n)]
        want = np.full(room, -7, np.float32)  # gaps keep their value
        for r in range(n):
            want[offs[r]:offs[r] + counts[r]] = ins[r]
        for in_place in (False, True):
            outs = [np.full(room, -7, np.float32) for _ in range(n)]
            if in_place:
                for r in range(n):
                    outs[r][offs[r]:offs[r] + counts[r]] = ins[r]
            pycoll.wait_all([t.allgatherv(None if in_place else ins[r], outs[r], counts, displs,
                                          algorithm=alg) for r, t in enumerate(teams)])
            assert_same(outs, want, f"allgatherv {alg} n={n} counts={counts} displs={displs} "
                                    f"in_place={in_place}")


# ------------------------------------------------------------------ reduce_scatter(v)
@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_rhalving(n):
    teams = pycoll.local_teams(n)
    for dtype in DTYPES_RS:
        dt = DTYPES[dtype]
        for op in [op for op in OPS_RS if op in valid_ops(dtype)]:
            for count in COUNTS:
                if count == 1000 and n > 9 and (dtype, op) != ("float32", ReduceOp.SUM):
                    continue  # the big cases once: the rest is the same code on more elements
                what = f"reduce_scatter rhalving n={n} {dtype} {op.name} count={count}"
                ins = [make_input(dtype, op, r, n * count, seed=count) for r in range(n)]
                want = expected(ins, op)
                srcs = [x.copy() for x in ins]
                outs = [np.full(count, 99, dt) for _ in range(n)]
                pycoll.wait_all([t.reduce_scatter(srcs[r], outs[r], op, algorithm="rhalving")
                                 for r, t in enumerate(teams)])
                for r in range(n):
                    assert_same([outs[r]], want[r * count:(r + 1) * count], f"{what} rank {r}")
                    assert np.array_equal(srcs[r].view(np.uint8), ins[r].view(np.uint8)), what
    # recvbuf is the rank's own block of sendbuf (as MPI_IN_PLACE leaves it)
    count = 5
    ins = [make_input("float32", ReduceOp.SUM, r, n * count, seed=1) for r in range(n)]
    want = expected(ins, ReduceOp.SUM)
    bufs = [x.copy() for x in ins]
    pycoll.wait_all([t.reduce_scatter(bufs[r], bufs[r][r * count:(r + 1) * count], algorithm="rhalving")
                     for r, t in enumerate(teams)])
    for r in range(n):
        assert_same([bufs[r][r * count:(r + 1) * count]], want[r * count:(r + 1) * count], "own block")


@pytest.mark.parametrize("n", [3, 5, 8, 33])
def test_reduce_scatter_rhalving_reproducible(n):
    """Random floats: the same bits on every call, and close to numpy's sum."""
    teams = pycoll.local_teams(n)
    count = 301
    rng = np.random.default_rng(n)
    ins = [rng.standard_normal(n * count).astype(np.float32) for _ in range(n)]
    results = []
    for _ in range(3):
        outs = [np.zeros(count, np.float32) for _ in range(n)]
        pycoll.wait_all([t.reduce_scatter(ins[r], outs[r], algorithm="rhalving")
                         for r, t in enumerate(teams)])
        results.append(np.concatenate(outs))
    assert all(res.tobytes() == results[0].tobytes() for res in results)
    np.testing.assert_allclose(results[0], np.sum(ins, axis=0, dtype=np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatterv_rhalving(n):
    teams = pycoll.local_teams(n)
    for counts, displs in layouts(n):
        if displs is not None:
            continue  # reduce_scatterv's blocks are back to back
        offs = [sum(counts[:k]) for k in range(n)]
        for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX):
            ins = [make_input("int64", op, r, sum(counts), seed=3) for r in range(n)]
            want = expected(ins, op)
            outs = [np.full(counts[r], 99, np.int64) for r in range(n)]
            pycoll.wait_all([t.reduce_scatterv(ins[r], outs[r], counts, op, algorithm="rhalving")
                             for r, t in enumerate(teams)])
            for r in range(n):
                assert_same([outs[r]], want[offs[r]:offs[r] + counts[r]],
                            f"reduce_scatterv n={n} {op.name} counts={counts} rank {r}")


# ------------------------------------------------------------------ alltoall
@pytest.mark.parametrize("n", SIZES)
def test_alltoall_bruck(n):
    teams = pycoll.local_teams(n)
    for count in COUNTS:
        for dtype in ("int64", "bfloat16"):
            dt = DTYPES[dtype]
            # the block rank s sends rank d: s * 1000 + d * 10 + its position (mod the dtype's range)
            ins = [((np.arange(n * count) % max(count, 1)) + 10 * (np.arange(n * count) // max(count, 1))
                    + 100 * s).astype(dt) for s in range(n)]
            outs = [np.full(n * count, -1, dt) for _ in range(n)]
            pycoll.wait_all([t.alltoall(ins[r], outs[r], algorithm="bruck") for r, t in enumerate(teams)])
            for d in range(n):
                want = (np.concatenate([ins[s][d * count:(d + 1) * count] for s in range(n)])
                        if count else np.zeros(0, dt))
                assert_same([outs[d]], want, f"alltoall bruck n={n} count={count} {dtype} rank {d}")
    # the same buffer for both (bruck reads every block before it writes one; pairwise sends from a
    # copy), twice: the second call repeats the first
    count = 3
    for alg in ("bruck", "pairwise"):
        bufs = [np.empty(n * count, np.int64) for _ in range(n)]
        for _ in range(2):
            for s, b in enumerate(bufs):
                b[:] = np.arange(n * count) + 1000 * s
            orig = [b.copy() for b in bufs]
            pycoll.wait_all([t.alltoall(bufs[r], bufs[r], algorithm=alg) for r, t in enumerate(teams)])
            for d in range(n):
                assert np.array_equal(bufs[d], np.concatenate([orig[s][d * count:(d + 1) * count]
                                                               for s in range(n)])), alg


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_pairwise_alltoall_follows_its_buffers_from_call_to_call(n):
    """Pairwise keeps its blocks' views for the buffers a call repeats: calls on new arrays, on
    the first ones again (their data changed), and v-calls of other counts all move the right
    blocks."""
    teams = pycoll.local_teams(n)
    count = 4
    first = [np.arange(n * count, dtype=np.int64) + 100 * s for s in range(n)]
    second = [np.arange(n * count, dtype=np.int64) * 7 + 1000 * s for s in range(n)]
    outs = [np.full(n * count, -1, np.int64) for _ in range(n)]
    for ins in (first, second, first, first):
        for x in ins:
            x += 1  # (the same arrays may hold other data the next time)
        pycoll.wait_all([t.alltoall(ins[r], outs[r], algorithm="pairwise") for r, t in enumerate(teams)])
        for d in range(n):
            want = np.concatenate([ins[s][d * count:(d + 1) * count] for s in range(n)])
            assert np.array_equal(outs[d], want), (n, d)
    for counts in ([2] * n, [(k % 3) + 1 for k in range(n)]):
        rc = [[counts[d]] * n for d in range(n)]  # rank s sends counts[d] to every d
        sc = [[counts[d] for d in range(n)] for _ in range(n)]
        send = [np.concatenate([np.arange(counts[d]) + 100 * s + 10 * d for d in range(n)]).astype(np.int64)
                for s in range(n)]
        recv = [np.full(sum(rc[d]), -1, np.int64) for d in range(n)]
        pycoll.wait_all([t.alltoallv(send[r], recv[r], sc[r], rc[r], algorithm="pairwise")
                         for r, t in enumerate(teams)])
        for d in range(n):
            want = np.concatenate([np.arange(counts[d]) + 100 * s + 10 * d for s in range(n)])
            assert np.array_equal(recv[d], want), (n, d, counts)


def test_bruck_alltoall_is_not_a_v_algorithm():
    assert "bruck" in algorithms.ALGORITHMS["alltoall"]
    assert "bruck" not in algorithms.ALGORITHMS["alltoallv"]
    assert {"rd", "bruck"} <= set(algorithms.ALGORITHMS["allgatherv"])
    assert "rhalving" in algorithms.ALGORITHMS["reduce_scatterv"]
    teams = pycoll.local_teams(2)
    with pytest.raises(ValueError, match="unknown alltoallv algorithm"):
        teams[0].alltoallv(np.zeros(2), np.zeros(2), [1, 1], [1, 1], algorithm="bruck")


# ------------------------------------------------------------------ persistent, credit
@pytest.mark.parametrize("coll,alg", [("allgather", "rd"), ("allgather", "bruck"),
                                      ("reduce_scatter", "rhalving"), ("alltoall", "bruck")])
@pytest.mark.parametrize("n", [3, 4, 6])
def test_persistent(n, coll, alg):
    teams = pycoll.local_teams(n)
    count = 11
    whole = count if coll == "allgather" else n * count
    srcs = [np.zeros(whole, np.float64) for _ in range(n)]
    outs = [np.zeros(n * count if coll != "reduce_scatter" else count) for _ in range(n)]
    pers = [getattr(t, f"{coll}_init")(srcs[r], outs[r], algorithm=alg) for r, t in enumerate(teams)]
    for it in range(3):
        ins = [make_input("float64", ReduceOp.SUM, r, whole, seed=it) for r in range(n)]
        for r in range(n):
            srcs[r][...] = ins[r]
            outs[r][...] = -1
        pycoll.wait_all([p.start() for p in pers])
        for r in range(n):
            if coll == "allgather":
                want = np.concatenate(ins)
            elif coll == "reduce_scatter":
                want = expected(ins, ReduceOp.SUM)[r * count:(r + 1) * count]
            else:
                want = np.concatenate([ins[s][r * count:(r + 1) * count] for s in range(n)])
            assert_same([outs[r]], want, f"persistent {coll} {alg} run {it} rank {r}")
    for p in pers:
        p.free()


def _task(coll, alg, rank, n, count=4):
    dst = np.zeros(n * count if coll != "reduce_scatter" else count)
    src = np.zeros(count if coll == "allgather" else n * count)
    layout = equal_layout(count, n)
    args = CollArgs(coll, rank, n, None, src, dst, layout=layout, rlayout=layout, name="t")
    return algorithms.get(coll, alg)(args)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 8])
def test_sends_first(n):
    """Every rank of the folding algorithms sends first, so every rank takes credit: a proxy sends
    its folded-out neighbour "go" before it waits for that neighbour's data (the message that starts
    the neighbour's collective past the credit)."""
    for coll, alg in (("allgather", "rd"), ("reduce_scatter", "rhalving"), ("allreduce", "rd"),
                      ("allreduce", "knomial")):
        assert all(_task(coll, alg, r, n).sends_first for r in range(n)), (coll, n)
    for coll, alg in (("allgather", "bruck"), ("alltoall", "bruck")):
        assert all(_task(coll, alg, r, n).sends_first for r in range(n))


@pytest.mark.parametrize("n", [3, 5])
def test_many_in_flight_with_small_credit(n):
    """Several collectives of each algorithm in flight at once under a small credit (the proxies
    take none until their neighbour's data arrives)."""
    ctx = pycoll.Context(credit_bytes=256)
    teams = pycoll.local_teams(n, ctx)
    count = 40
    ins = [np.full(count, r + 1.0) for r in range(n)]
    reqs, checks = [], []
    for _ in range(3):
        ag = [np.zeros(n * count) for _ in range(2 * n)]
        rs = [np.zeros(count) for _ in range(n)]
        for i, alg in enumerate(ALLGATHER):
            reqs += [t.allgather(ins[r], ag[i * n + r], algorithm=alg) for r, t in enumerate(teams)]
        reqs += [t.reduce_scatter(np.tile(ins[r], n), rs[r], algorithm="rhalving")
                 for r, t in enumerate(teams)]
        checks.append((ag, rs))
    pycoll.wait_all(reqs)
    for ag, rs in checks:
        assert all(np.array_equal(a, np.repeat(np.arange(1.0, n + 1), count)) for a in ag)
        assert all((x == n * (n + 1) / 2).all() for x in rs)


def test_default_selection():
    """The point-to-point defaults (DEFAULT_RULES; the shm rules come first on a shared team)."""
    sel = algorithms.select
    for coll in ("allgather", "allgatherv"):
        assert sel(coll, 2, 1024) == "ring"
        assert sel(coll, 3, 1024) == "rd" and sel(coll, 8, (4 << 20) - 1) == "rd"
        assert sel(coll, 8, 4 << 20) == "ring"
        assert sel(coll, 4, 1024, shared=True) == "shm"
    for coll in ("reduce_scatter", "reduce_scatterv"):
        assert sel(coll, 2, 8) == "rhalving" and sel(coll, 5, (1 << 20) - 1) == "rhalving"
        assert sel(coll, 5, 1 << 20) == "ring"
        assert sel(coll, 4, 1024, shared=True) == "shm"
    assert sel("alltoall", 3, 64) == "pairwise"
    assert sel("alltoall", 4, 64) == "bruck" and sel("alltoall", 16, (128 << 10) - 1) == "bruck"
    assert sel("alltoall", 4, 128 << 10) == "pairwise"
    assert sel("alltoallv", 8, 0) == "pairwise"
    # and the team uses them: a default 8-rank allgather and alltoall of small blocks
    teams = pycoll.local_teams(8)
    outs = [np.zeros(8, np.int32) for _ in range(8)]
    pycoll.wait_all([t.allgather(np.array([r], np.int32), outs[r]) for r, t in enumerate(teams)])
    assert all(np.array_equal(o, np.arange(8)) for o in outs)
    assert teams[0].planner.selected("allgather", 32) == "rd"
