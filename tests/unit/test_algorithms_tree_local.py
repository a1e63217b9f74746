"""The tree and large-message algorithms (bcast ``scatter_allgather``, reduce ``rs_gather``,
gather/scatter(v) ``knomial``) on in-process teams against numpy: team sizes 1..9, 16, 33, every
root (first, middle, last), counts 0, 1, odd and large, reduce dtypes and ops, in place at the
root, v-forms with unequal counts, gaps and reversed displacements, radix 2-4, persistent
collectives. The same algorithms over MPI on 3 and 4 processes: tests/coll/test_algorithms_mpi.py."""

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp
from pycoll.algorithms import select
from pycoll.algorithms.gather_knomial import knomial_tree
from pycoll.ops import DTYPES
from tests.reference import assert_same, expected, make_input, valid_ops

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33]
COUNTS = [0, 1, 7, 1000]
RADIXES = [2, 3, 4]


def roots(n):
    return sorted({0, n // 2, n - 1})


def drained(teams):
    assert teams[0].transport.fabric.pending_messages() == 0


@pytest.mark.parametrize("n", SIZES)
def test_knomial_tree_covers_every_rank_once(n):
    for radix in RADIXES:
        seen = {0}
        for v in range(n):
            parent, children, end = knomial_tree(v, n, radix)
            assert (parent is None) == (v == 0)
            covered = [v]
            for c, ce in children:
                assert knomial_tree(c, n, radix)[0] == v and knomial_tree(c, n, radix)[2] == ce
                covered.extend(range(c, ce))
                seen.add(c)
            assert sorted(covered) == list(range(v, end)), (v, radix)
        assert seen == set(range(n))


@pytest.mark.parametrize("n", SIZES)
def test_bcast_scatter_allgather(n):
    teams = pycoll.local_teams(n)
    for root in roots(n):
        for count in COUNTS + [n - 1, n + 1, 3 * n + 2]:
            want = (np.arange(count, dtype=np.int64) * 7 + root) % 253
            want = want.astype(np.uint8)
            bufs = [want.copy() if r == root else np.zeros(count, np.uint8) for r in range(n)]
            pycoll.wait_all([t.bcast(bufs[r], root=root, algorithm="scatter_allgather")
                             for r, t in enumerate(teams)])
            assert all(np.array_equal(b, want) for b in bufs), (root, count)
        # a typed buffer goes as its bytes
        want = np.arange(333, dtype=np.float32) - root
        bufs = [want.copy() if r == root else np.zeros(333, np.float32) for r in range(n)]
        pycoll.wait_all([t.bcast(bufs[r], root=root, algorithm="scatter_allgather")
                         for r, t in enumerate(teams)])
        assert all(np.array_equal(b, want) for b in bufs), root
    drained(teams)


@pytest.mark.parametrize("n", SIZES)
def test_reduce_rs_gather_every_root_and_in_place(n):
    teams = pycoll.local_teams(n)
    for root in roots(n):
        for count in COUNTS + [n + 2]:
            for in_place in (False, True):
                ins = [make_input("float64", ReduceOp.SUM, r, count, seed=root) for r in range(n)]
                bufs = [x.copy() for x in ins]
                out = np.full(count, -99.0)
                reqs = [t.reduce(bufs[r], None if r != root or in_place else out, root=root,
                                 algorithm="rs_gather") for r, t in enumerate(teams)]
                pycoll.wait_all(reqs)
                got = bufs[root] if in_place else out
                assert_same([got], expected(ins, ReduceOp.SUM), f"{root=} {count=} {in_place=}")
                for r in range(n):
                    if r != root or not in_place:
                        assert np.array_equal(bufs[r], ins[r]), (r, "input written")
    drained(teams)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 9])
@pytest.mark.parametrize("dtype", ["float32", "int64", "bfloat16", "float16"])
def test_reduce_rs_gather_dtypes_and_ops(n, dtype):
    teams = pycoll.local_teams(n)
    ops = [op for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.PROD, ReduceOp.AVG) if op in valid_ops(dtype)]
    assert ReduceOp.SUM in ops and ReduceOp.MAX in ops
    for op in ops:
        for count in (1, 13, 1000):
            root = count % n
            ins = [make_input(dtype, op, r, count, seed=count) for r in range(n)]
            want = expected(ins, op)
            out = np.zeros(count, DTYPES[dtype])
            pycoll.wait_all([t.reduce(ins[r].copy(), out if r == root else None, op, root=root,
                                      algorithm="rs_gather") for r, t in enumerate(teams)])
            assert_same([out], want, f"{dtype} {op.name} count={count}")
            # in place at the root
            bufs = [x.copy() for x in ins]
            pycoll.wait_all([t.reduce(bufs[r], None, op, root=root, algorithm="rs_gather")
                             for r, t in enumerate(teams)])
            assert_same([bufs[root]], want, f"{dtype} {op.name} count={count} in place")
    drained(teams)


@pytest.mark.parametrize("n", SIZES)
def test_gather_scatter_knomial_every_root_and_radix(n):
    teams = pycoll.local_teams(n)
    for radix in RADIXES:
        for root in roots(n):
            for count in COUNTS:
                ins = [np.arange(count, dtype=np.int32) + 10_000 * r for r in range(n)]
                whole = np.concatenate(ins)
                out = np.full(n * count, -1, np.int32)
                pycoll.wait_all([t.gather(ins[r], out if r == root else None, root=root, algorithm="knomial",
                                          radix=radix) for r, t in enumerate(teams)])
                assert np.array_equal(out, whole), ("gather", radix, root, count)
                outs = [np.full(count, -1, np.int32) for _ in range(n)]
                src = whole.copy()
                pycoll.wait_all([t.scatter(src if r == root else None, outs[r], root=root,
                                           algorithm="knomial", radix=radix) for r, t in enumerate(teams)])
                assert all(np.array_equal(outs[r], ins[r]) for r in range(n)), ("scatter", radix, root, count)
                assert np.array_equal(src, whole)
            # in place at the root: gather's sendbuf and scatter's recvbuf are its block of the buffer
            count = 5
            ins = [np.arange(count, dtype=np.float64) + 100 * r for r in range(n)]
            whole = np.concatenate(ins)
            out = np.where(np.arange(n * count) // count == root, whole, -1.0)
            pycoll.wait_all([t.gather(None if r == root else ins[r], out if r == root else None, root=root,
                                      algorithm="knomial", radix=radix) for r, t in enumerate(teams)])
            assert np.array_equal(out, whole), ("gather in place", radix, root)
            outs = [np.zeros(count) for _ in range(n)]
            src = whole.copy()
            pycoll.wait_all([t.scatter(src if r == root else None, None if r == root else outs[r], root=root,
                                       algorithm="knomial", radix=radix) for r, t in enumerate(teams)])
            assert all(np.array_equal(outs[r], ins[r]) for r in range(n) if r != root)
            assert np.array_equal(src, whole), ("scatter in place", radix, root)
    drained(teams)


def v_layouts(n):
    """(counts, displs, room) triples: unequal with zeros, gaps, reversed displacements."""
    counts = [(3 * r + 1) % 5 for r in range(n)]  # includes zeros from n >= 2
    packed = [0]
    for c in counts[:-1]:
        packed.append(packed[-1] + c)
    gaps = [d + 2 * r + 1 for r, d in enumerate(packed)]
    rev, at = [0] * n, 0
    for r in reversed(range(n)):
        rev[r] = at
        at += counts[r] + (r % 2)
    return [(counts, None, sum(counts)), (counts, gaps, gaps[-1] + counts[-1] + 3), (counts, rev, at)]


@pytest.mark.parametrize("n", SIZES)
def test_gatherv_scatterv_knomial(n):
    teams = pycoll.local_teams(n)
    for counts, displs, room in v_layouts(n):
        offs = displs if displs is not None else [sum(counts[:r]) for r in range(n)]
        for radix in RADIXES:
            for root in roots(n):
                ins = [np.arange(counts[r], dtype=np.int64) + 1000 * r for r in range(n)]
                out = np.full(room, -7, np.int64)
                want = out.copy()
                for r in range(n):
                    want[offs[r]:offs[r] + counts[r]] = ins[r]
                pycoll.wait_all([t.gatherv(ins[r], out if r == root else None, counts, displs, root=root,
                                           algorithm="knomial", radix=radix) for r, t in enumerate(teams)])
                assert np.array_equal(out, want), ("gatherv", counts, displs, radix, root)
                outs = [np.full(counts[r], -1, np.int64) for r in range(n)]
                pycoll.wait_all([t.scatterv(want if r == root else None, outs[r], counts, displs, root=root,
                                            algorithm="knomial", radix=radix) for r, t in enumerate(teams)])
                assert all(np.array_equal(outs[r], ins[r]) for r in range(n)), ("scatterv", radix, root)
    if n > 1:  # scatterv blocks may overlap: every rank gets the same elements
        counts, displs = [4] * n, [2] * n
        src = np.arange(8, dtype=np.float32)
        outs = [np.zeros(4, np.float32) for _ in range(n)]
        pycoll.wait_all([t.scatterv(src if r == n - 1 else None, outs[r], counts, displs, root=n - 1,
                                    algorithm="knomial") for r, t in enumerate(teams)])
        assert all(np.array_equal(o, src[2:6]) for o in outs)
    drained(teams)


def test_v_knomial_needs_counts_everywhere():
    teams = pycoll.local_teams(3)
    with pytest.raises(ValueError, match="gatherv 'knomial' needs counts on every rank"):
        teams[1].gatherv(np.zeros(2), root=0, algorithm="knomial")
    with pytest.raises(ValueError, match="scatterv 'knomial' needs counts on every rank"):
        teams[2].scatterv(None, np.zeros(2), root=0, algorithm="knomial")
    assert teams[1].next_sequence() == 0 and teams[2].next_sequence() == 0  # no key was taken
    # linear still works without counts off the root
    teams = pycoll.local_teams(3)
    out = np.zeros(6)
    pycoll.wait_all([t.gatherv(np.full(2, float(r)), out if r == 0 else None, [2, 2, 2] if r == 0 else None,
                               root=0) for r, t in enumerate(teams)])
    assert np.array_equal(out, np.repeat([0.0, 1.0, 2.0], 2))


def test_sends_first_only_where_the_first_move_is_a_send():
    from pycoll.algorithms import bcast_scatter_allgather, gather_knomial, reduce_rs_gather, scatter_knomial
    from pycoll.algorithms.base import CollArgs, equal_layout

    n, root = 6, 2
    teams = pycoll.local_teams(n)
    for r in range(n):
        ch = teams[r].transport.channel(("x",))
        buf = np.zeros(12)

        def args(coll, layout=None, r=r, ch=ch, buf=buf):
            return CollArgs(coll, r, n, ch, buf, buf, root=root, layout=layout)

        assert bcast_scatter_allgather.build(args("bcast")).sends_first == (r == root)
        assert reduce_rs_gather.build(args("reduce")).sends_first
        assert scatter_knomial.build(args("scatter", equal_layout(2, n))).sends_first == (r == root)
        v = (r - root) % n
        leaf = v % 2 == 1  # binomial tree of 6: vranks 1, 3, 5 are leaves
        assert gather_knomial.build(args("gather", equal_layout(2, n))).sends_first == leaf


def test_persistent_reduce_and_scatter_restarted():
    n = 5
    teams = pycoll.local_teams(n)
    root = 3
    bufs = [np.zeros(1001, np.float32) for _ in range(n)]
    out = np.zeros(1001, np.float32)
    reds = [t.reduce_init(bufs[r], out if r == root else None, ReduceOp.SUM, root=root, algorithm="rs_gather")
            for r, t in enumerate(teams)]
    src = np.zeros(n * 9, np.int16)
    souts = [np.zeros(9, np.int16) for _ in range(n)]
    scats = [t.scatter_init(src if r == 1 else None, souts[r], root=1, algorithm="knomial", radix=3)
             for r, t in enumerate(teams)]
    gout = np.zeros(n * 4)
    gins = [np.zeros(4) for _ in range(n)]
    gaths = [t.gather_init(gins[r], gout if r == 0 else None, root=0, algorithm="knomial")
             for r, t in enumerate(teams)]
    bbufs = [np.zeros(100_003, np.uint8) for _ in range(n)]
    bcasts = [t.bcast_init(bbufs[r], root=n - 1, algorithm="scatter_allgather") for r, t in enumerate(teams)]
    for it in range(3):
        for r in range(n):
            bufs[r][:] = np.arange(1001) % 7 + r + it
            gins[r][:] = r * 10 + it
            bbufs[r][:] = (it + 1) * (r == n - 1)
        src[:] = np.arange(n * 9) + it
        pycoll.wait_all([p.start() for p in reds + scats + gaths + bcasts])
        assert_same([out], sum(b.astype(np.float64) for b in bufs).astype(np.float32), f"reduce run {it}")
        assert all(np.array_equal(souts[r], src[9 * r:9 * r + 9]) for r in range(n)), it
        assert np.array_equal(gout, np.repeat(np.arange(n) * 10.0 + it, 4)), it
        assert all((b == it + 1).all() for b in bbufs), it
    for p in reds + scats + gaths + bcasts:
        p.free()
    drained(teams)


def test_default_selection():
    # teams without a shared segment (over MPI between hosts, or PYCOLL_TLS=mpi); see DEFAULT_RULES
    assert select("bcast", 4, 8) == select("bcast", 4, 16 << 20) == "knomial"
    assert select("reduce", 4, 1 << 20) == "knomial"
    assert select("reduce", 2, 4 << 20) == select("reduce", 8, 16 << 20) == "rs_gather"
    assert select("gather", 4, 64 << 10) == select("gather", 4, 16 << 20) == "linear"
    assert select("gather", 2, 1 << 20) == "linear" and select("gather", 8, 1 << 20) == "knomial"
    assert select("scatter", 8, 1 << 20) == "linear"
    assert select("gatherv", 4, 0) == "linear" and select("scatterv", 4, 0) == "linear"  # no counts needed

