"""Algorithm options (``OPTIONS`` of each algorithm module, read from ``args.options`` by
``pycoll.algorithms.options.options``): every documented option changes what runs, results still
match numpy, and an unknown or bad option is a ValueError raised before anything is sent.

What runs is seen from outside the algorithm: the messages each rank sent to each peer
(``team.traffic()``), and the tasks a collective's schedule built (``request.task``)."""

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp
from pycoll.algorithms import ALGORITHMS, MODULES
from pycoll.algorithms.base import CollArgs, equal_layout

# (they count messages, bytes or spans, or look inside a request's task: see the fixture)
pytestmark = pytest.mark.usefixtures("no_agreement_check")


#: (collective, algorithm, option) proven below; every documented option must be here.
COVERED = {
    ("allreduce", "ring", "fragment_bytes"), ("allreduce", "ring", "depth"),
    ("allreduce", "knomial", "radix"), ("bcast", "knomial", "radix"), ("reduce", "knomial", "radix"),
    ("gather", "knomial", "radix"), ("gatherv", "knomial", "radix"),
    ("scatter", "knomial", "radix"), ("scatterv", "knomial", "radix"),
    ("allreduce", "rab", "fragment_bytes"), ("allreduce", "rab", "depth"),
    ("allreduce", "split_rail", "fragment_bytes"), ("allreduce", "split_rail", "depth"),
    ("bcast", "hier", "fragment_bytes"), ("bcast", "hier", "depth"),
}


@pytest.fixture(autouse=True)
def whole_collectives(monkeypatch):
    """No partitioning or credit from the environment: one request is one algorithm's task."""
    for var in ("PYCOLL_PARTITION_BYTES", "PYCOLL_CREDIT_BYTES", "PYCOLL_TUNE"):
        monkeypatch.delenv(var, raising=False)


def run(reqs):
    """The requests of one collective on every rank, finished."""
    pycoll.wait_all(reqs)
    return reqs


def sent(team, field="msgs_sent"):
    """Messages this rank sent to (or received from) each peer, sub-teams included: ``{peer: n}``
    without zeros."""
    return {p: f[field] for p, f in team.traffic().items() if p != "total" and f[field]}


def total_sent(teams):
    return sum(t.traffic()["total"]["msgs_sent"] for t in teams)


def inputs(n, count, dtype=np.float64):
    return [(np.arange(count) % 13 + r).astype(dtype) for r in range(n)]


def test_every_documented_option_is_proven():
    declared = {(coll, name, opt) for coll, table in MODULES.items() for name, mod in table.items()
                for opt in mod.OPTIONS}
    assert declared == COVERED
    for coll, table in MODULES.items():
        for name, mod in table.items():
            for opt, spec in mod.OPTIONS.items():
                assert spec.help and spec.default >= spec.minimum, (coll, name, opt)


# ---------------------------------------------------------------- ring allreduce


def ring_allreduce(n, count, **options):
    teams = pycoll.local_teams(n)
    ins = inputs(n, count)
    bufs = [x.copy() for x in ins]
    reqs = run([t.allreduce(bufs[t.rank], algorithm="ring", **options) for t in teams])
    want = np.sum(ins, axis=0)
    for b in bufs:
        np.testing.assert_array_equal(b, want)
    return teams, reqs


@pytest.mark.parametrize("fragment_bytes, frags", [(None, 1), (30_000, 8), (6_000, 40)])
def test_ring_fragment_bytes_sets_the_fragments(fragment_bytes, frags):
    """3 ranks, 30000 float64: blocks of 10000 elements; a fragment takes fragment_bytes / (3 * 8)
    elements of every block (1 MiB by default: one fragment). Each fragment is 2(n-1) messages per
    rank (this failed when the ring ignored its options)."""
    n = 3
    options = {} if fragment_bytes is None else {"fragment_bytes": fragment_bytes}
    teams, reqs = ring_allreduce(n, 30_000, **options)
    assert reqs[0].task.n_fragments == frags
    for t in teams:
        assert sent(t) == {(t.rank + 1) % n: 2 * (n - 1) * frags}


@pytest.mark.parametrize("depth", [1, 3, 5])
def test_ring_depth_sets_the_fragments_in_flight(depth):
    """The pipeline builds one reusable slot (a schedule) per fragment in flight."""
    _, reqs = ring_allreduce(3, 30_000, fragment_bytes=30_000, depth=depth)
    for req in reqs:
        assert req.task.n_fragments == 8 and len(req.task.tasks) == depth


# ---------------------------------------------------------------- k-nomial trees


def test_allreduce_knomial_radix_sets_the_groups():
    """8 ranks: radix 2 is three pairwise exchanges (peers rank ^ 1, 2, 4); radix 8 is one group
    of all eight."""
    n = 8
    for radix, peers in ((2, lambda r: {r ^ 1, r ^ 2, r ^ 4}), (8, lambda r: set(range(n)) - {r})):
        teams = pycoll.local_teams(n)
        ins = inputs(n, 100)
        bufs = [x.copy() for x in ins]
        run([t.allreduce(bufs[t.rank], algorithm="knomial", radix=radix) for t in teams])
        for t in teams:
            np.testing.assert_array_equal(bufs[t.rank], np.sum(ins, axis=0))
            assert sent(t) == dict.fromkeys(peers(t.rank), 1), (radix, t.rank)


#: 9 ranks, root 0: the root's children for radix 2 (binomial), 3 and 9 (flat)
TREE = {2: {1, 2, 4, 8}, 3: {1, 2, 3, 6}, 9: set(range(1, 9))}


@pytest.mark.parametrize("radix", sorted(TREE))
def test_bcast_and_scatter_knomial_radix_set_the_roots_children(radix):
    n = 9
    teams = pycoll.local_teams(n)
    want = np.arange(50, dtype=np.int32)
    bufs = [want.copy() if r == 0 else np.zeros(50, np.int32) for r in range(n)]
    run([t.bcast(bufs[t.rank], 0, algorithm="knomial", radix=radix) for t in teams])
    assert all(np.array_equal(b, want) for b in bufs)
    assert sent(teams[0]) == dict.fromkeys(TREE[radix], 1)

    for v in (False, True):
        teams = pycoll.local_teams(n)
        src = np.arange(n * 4, dtype=np.float32)
        outs = [np.zeros(4, np.float32) for _ in range(n)]
        if v:
            run([t.scatterv(src if t.rank == 0 else None, outs[t.rank], counts=[4] * n, root=0,
                            algorithm="knomial", radix=radix) for t in teams])
        else:
            run([t.scatter(src if t.rank == 0 else None, outs[t.rank], root=0, algorithm="knomial",
                           radix=radix) for t in teams])
        for r in range(n):
            np.testing.assert_array_equal(outs[r], src[4 * r:4 * r + 4])
        assert sent(teams[0]) == dict.fromkeys(TREE[radix], 1), v


@pytest.mark.parametrize("radix", sorted(TREE))
def test_reduce_and_gather_knomial_radix_set_the_roots_children(radix):
    n = 9
    teams = pycoll.local_teams(n)
    ins = inputs(n, 30)
    out = np.zeros(30)
    run([t.reduce(ins[t.rank], out if t.rank == 0 else None, ReduceOp.SUM, 0, algorithm="knomial",
                  radix=radix) for t in teams])
    np.testing.assert_array_equal(out, np.sum(ins, axis=0))
    assert sent(teams[0], "msgs_received") == dict.fromkeys(TREE[radix], 1)

    for v in (False, True):
        teams = pycoll.local_teams(n)
        ins = inputs(n, 3)
        out = np.zeros(3 * n)
        if v:
            run([t.gatherv(ins[t.rank], out if t.rank == 0 else None, counts=[3] * n, root=0,
                           algorithm="knomial", radix=radix) for t in teams])
        else:
            run([t.gather(ins[t.rank], out if t.rank == 0 else None, root=0, algorithm="knomial",
                          radix=radix) for t in teams])
        np.testing.assert_array_equal(out, np.concatenate(ins))
        assert sent(teams[0], "msgs_received") == dict.fromkeys(TREE[radix], 1), v


# ---------------------------------------------------------------- hierarchical


@pytest.fixture
def two_nodes(monkeypatch):
    """8 in-process ranks as two nodes of 4: node teams of 4, rails of 2."""
    monkeypatch.setenv("PYCOLL_RANKS_PER_NODE", "4")
    return lambda: pycoll.local_teams(8)


def hier_allreduce(teams, alg, count, **options):
    ins = inputs(8, count, np.float32)
    bufs = [x.copy() for x in ins]
    reqs = run([t.allreduce(bufs[t.rank], algorithm=alg, **options) for t in teams])
    for b in bufs:
        np.testing.assert_array_equal(b, np.sum(ins, axis=0))
    return reqs


def levels(req):
    """The collective of each level task of a hierarchical schedule, in the order it was built."""
    return [t.name.split(":")[0] for t in req.task.tasks]


@pytest.mark.parametrize("alg", ["rab", "split_rail"])
def test_hierarchical_allreduce_fragment_bytes_sets_the_fragments(two_nodes, alg):
    """5000 float32 (20000 B): one fragment by default (4 MiB), five of 4000 B; each fragment runs
    every level once, so five times the messages."""
    one = two_nodes()
    hier_allreduce(one, alg, 5000)
    five = two_nodes()
    hier_allreduce(five, alg, 5000, fragment_bytes=4000)
    assert total_sent(one) > 0 and total_sent(five) == 5 * total_sent(one)


@pytest.mark.parametrize("alg, first, second", [("rab", "reduce", "bcast"),
                                                ("split_rail", "reduce_scatterv", "allgatherv")])
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_hierarchical_allreduce_depth_sets_the_node_steps_ahead(two_nodes, alg, first, second, depth):
    """The node's first step of ``depth + 1`` fragments is built before its second step of
    fragment 0 (rank 1: second on its node; split_rail's rails between them)."""
    reqs = hier_allreduce(two_nodes(), alg, 5000, fragment_bytes=2000, depth=depth)  # 10 fragments
    order = levels(reqs[1])
    assert order.count(first) == order.count(second) == 10
    assert order[:order.index(second)].count(first) == depth + 1, order


def test_bcast_hier_options_set_the_fragments(two_nodes):
    want = np.arange(3000, dtype=np.int16)
    counts, orders = [], []
    for options in ({}, {"fragment_bytes": 1000}, {"fragment_bytes": 1000, "depth": 3}):
        teams = two_nodes()
        bufs = [want.copy() if r == 0 else np.zeros_like(want) for r in range(8)]
        reqs = run([t.bcast(bufs[t.rank], 0, algorithm="hier", **options) for t in teams])
        assert all(np.array_equal(b, want) for b in bufs)
        counts.append(total_sent(teams))
        # rank 0 leads the root's node: node bcasts (4 ranks) then leaders' bcasts (2 ranks)
        orders.append([t.args.size for t in reqs[0].task.tasks])
    assert counts[1] == 6 * counts[0] > 0  # 6000 B: six fragments of 1000 B
    assert counts[2] == counts[1]
    assert orders[1].index(2) == 3 and orders[2].index(2) == 4  # depth 2 (default) and 3, plus one


# ---------------------------------------------------------------- unknown and bad options


def test_every_algorithm_rejects_an_unknown_option_naming_its_own():
    for coll, table in MODULES.items():
        for name, mod in table.items():
            buf = np.zeros(8)
            args = CollArgs(coll, 0, 2, None, buf, buf, name=f"{coll}:{name}@0", options={"radixx": 2},
                            layout=equal_layout(4, 2), rlayout=equal_layout(4, 2))
            with pytest.raises(ValueError, match="unknown option 'radixx'") as err:
                ALGORITHMS[coll][name](args)
            for opt in mod.OPTIONS:
                assert opt in str(err.value), (coll, name)


@pytest.mark.parametrize("alg, options", [("ring", {"fragment_byte": 4096}), ("ring", {"depth": 0}),
                                          ("ring", {"fragment_bytes": "1M"}), ("ring", {"depth": 2.5}),
                                          ("knomial", {"radix": 1}), ("rd", {"radix": 2})])
def test_a_bad_option_is_an_error_before_anything_is_sent(alg, options):
    n = 3
    teams = pycoll.local_teams(n)
    buf = np.ones(1000)
    with pytest.raises(ValueError, match="option"):
        teams[0].allreduce(buf, algorithm=alg, **options)
    assert total_sent(teams) == 0 and teams[0].transport.fabric.pending_messages() == 0
    # nothing was taken either: the next collective matches on every rank
    bufs = [np.full(1000, r + 1.0) for r in range(n)]
    run([t.allreduce(bufs[t.rank], algorithm=alg) for t in teams])
    assert all((b == 6).all() for b in bufs)
