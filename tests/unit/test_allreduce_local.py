"""Allreduce algorithms on in-process teams: the correctness matrix against numpy."""

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, TaskState
from pycoll.ops import DTYPES
from tests.reference import ALL_DTYPES, assert_same, expected, make_input, valid_ops

ALGS = ["rd", "ring", "knomial"]


def run_allreduce(n, dtype, op, count, alg, in_place, **kw):
    teams = pycoll.local_teams(n)
    inputs = [make_input(dtype, op, r, count) for r in range(n)]
    want = expected(inputs, op)
    bufs = [x.copy() for x in inputs]
    outs = [np.zeros(count, DTYPES[dtype]) for _ in range(n)]
    reqs = [team.allreduce(bufs[r], None if in_place else outs[r], op, algorithm=alg, **kw)
            for r, team in enumerate(teams)]
    results = pycoll.wait_all(reqs)
    got = bufs if in_place else outs
    assert all(res is g for res, g in zip(results, got))
    assert_same(got, want, f"{alg} n={n} {dtype} {op.name} count={count} in_place={in_place}")
    if not in_place:
        for r in range(n):
            np.testing.assert_array_equal(bufs[r], inputs[r])  # input untouched
    assert teams[0].transport.fabric.pending_messages() == 0


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_and_op(alg, dtype):
    for op in valid_ops(dtype):
        for n in (3, 4):
            for count in (0, 1, n - 1, n + 1, 1000):
                run_allreduce(n, dtype, op, count, alg, in_place=(count % 2 == 0))


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 31, 32, 33, 64])
def test_team_sizes(alg, n):
    for count in (0, 1, n - 1, n + 1, 100):
        run_allreduce(n, "int64", ReduceOp.SUM, count, alg, in_place=False)
    run_allreduce(n, "float32", ReduceOp.MAX, 37, alg, in_place=True)


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("dtype,op", [("float32", ReduceOp.SUM), ("bfloat16", ReduceOp.SUM),
                                      ("int32", ReduceOp.BXOR), ("float64", ReduceOp.AVG)])
def test_large_counts(alg, dtype, op):
    for n, in_place in ((2, False), (3, True), (5, False)):
        run_allreduce(n, dtype, op, (1 << 20) + 3, alg, in_place)


@pytest.mark.parametrize("radix", [2, 3, 4, 8])
def test_knomial_radix(radix):
    for n in (2, 5, 9, 16, 27):
        run_allreduce(n, "int32", ReduceOp.SUM, 50, "knomial", False, radix=radix)


def test_ring_pipelines_many_fragments():
    from pycoll.algorithms import allreduce_ring

    teams = pycoll.local_teams(3)
    data = [np.arange(100_000, dtype=np.float64) + r for r in range(3)]
    tasks = []
    for r, team in enumerate(teams):
        planner = team.planner
        call = team.call("allreduce", data[r], None, ReduceOp.SUM)
        args = planner.args(call, planner.coll_key(None), "ring", {"fragment_bytes": 30_000, "depth": 3})
        tasks.append(allreduce_ring.build(args))
    reqs = [teams[0].ctx.submit(t) for t in tasks]
    pycoll.wait_all(reqs)
    assert tasks[0].n_fragments > 20 and len(tasks[0].tasks) == 3
    want = sum(np.arange(100_000, dtype=np.float64) + r for r in range(3))
    assert_same(data, want, "ring fragments")


def test_invalid_arguments_raise_before_anything_is_sent():
    a, b = pycoll.local_teams(2)
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="BAND is not defined for float32"):
        a.allreduce(x, op=ReduceOp.BAND)
    with pytest.raises(ValueError, match="must match"):
        a.allreduce(x, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="must match"):
        a.allreduce(x, np.ones(4, np.float64))
    with pytest.raises(ValueError, match="not contiguous"):
        a.allreduce(np.ones(8, np.float32)[::2])
    with pytest.raises(ValueError, match="read-only"):
        a.allreduce(np.frombuffer(b"\0" * 16, np.float32))
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'nope'"):
        a.allreduce(x, algorithm="nope")
    with pytest.raises(ValueError, match="unknown reduction"):
        a.allreduce(x, op="median")
    with pytest.raises(ValueError, match="not supported"):
        a.allreduce(np.ones(2, np.float128) if hasattr(np, "float128") else np.array(["a"]))
    assert a.next_sequence() == 0  # nothing above consumed a sequence number
    assert a.transport.fabric.pending_messages() == 0


def test_tagged_collectives_posted_in_different_orders_under_small_credit():
    n, k = 4, 12
    ctx = pycoll.Context(credit_bytes=4096, partition_bytes=0, timeout=30)
    teams = pycoll.local_teams(n, ctx)
    rng = np.random.default_rng(1)
    data = {(r, t): np.full(2000 + 100 * t, float(r + t)) for r in range(n) for t in range(k)}
    reqs = []
    for r, team in enumerate(teams):
        for t in rng.permutation(k):
            reqs.append(team.allreduce(data[r, t], tag=f"grad{t}", priority=int(rng.integers(0, 3))))
    pycoll.wait_all(reqs)
    for t in range(k):
        for r in range(n):
            assert (data[r, t] == sum(rr + t for rr in range(n))).all()


def test_tag_reuse_matches_by_occurrence():
    teams = pycoll.local_teams(2)
    bufs = [[np.full(3, float(10 * i + r)) for i in range(3)] for r in range(2)]
    reqs = [team.allreduce(bufs[r][i], tag="w") for i in range(3) for r, team in enumerate(teams)]
    pycoll.wait_all(reqs)
    assert [b[0] for b in bufs[0]] == [1.0, 21.0, 41.0]


def test_partitioned_allreduce_and_priority():
    ctx = pycoll.Context(credit_bytes=0, partition_bytes=4096, timeout=30)
    teams = pycoll.local_teams(3, ctx)
    data = [np.arange(10_000, dtype=np.float32) * (r + 1) for r in range(3)]
    want = sum(np.arange(10_000, dtype=np.float32) * (r + 1) for r in range(3))
    pycoll.wait_all([t.allreduce(data[r], priority=3) for r, t in enumerate(teams)])
    assert_same(data, want, "partitioned")
    assert ctx.posted > 30


def test_wait_returns_output_and_timeout_names_peer():
    a, b = pycoll.local_teams(2)
    x = np.ones(3)
    req = a.allreduce(x, timeout=0.1)  # rank 1 never joins
    with pytest.raises(pycoll.TimeoutError, match="rank 1"):
        req.wait()


def test_partitioned_tagged_collectives_in_different_orders_under_credit_of_one_part():
    n = 3
    ctx = pycoll.Context(credit_bytes=4096, partition_bytes=4096, timeout=30)
    teams = pycoll.local_teams(n, ctx)
    data = {(r, t): np.full(3000 + 7 * t, float(r + t), np.float32) for r in range(n) for t in range(5)}
    reqs = []
    for r, team in enumerate(teams):
        for t in np.random.default_rng(r).permutation(5):
            reqs.append(team.allreduce(data[r, int(t)], tag=("big", int(t))))
    pycoll.wait_all(reqs)
    for (_r, t), buf in data.items():
        assert (buf == sum(rr + t for rr in range(n))).all()
    assert ctx.stats["credit_waits"] > 0


@pytest.mark.parametrize("alg", ["rd", "ring"])  # (knomial: every dtype and op in the process matrix)
def test_large_count_every_dtype_and_op(alg):
    count = (1 << 20) + 3
    for i, dtype in enumerate(ALL_DTYPES):
        for j, op in enumerate(valid_ops(dtype)):
            run_allreduce(3, dtype, op, count, alg, in_place=(i + j) % 2 == 0)


@pytest.mark.usefixtures("no_agreement_check")  # counts tasks and spans
def test_plans_are_reused_and_finalized_when_dropped(monkeypatch):
    import pycoll.planner as planner

    monkeypatch.setattr(planner, "MAX_PLAN_SHAPES", 2)
    teams = pycoll.local_teams(2)
    finalized = []
    first = None
    for count in (10, 10, 20, 30):
        bufs = [np.ones(count) for _ in teams]
        reqs = [t.allreduce(b) for t, b in zip(teams, bufs)]
        pycoll.wait_all(reqs)
        if first is None:
            first = reqs[0].task
            first.finalize = lambda: finalized.append("first")
        elif count == 10:
            assert reqs[0].task is first  # same shape: the finished task was reused
    assert finalized == ["first"]  # dropped when a third shape came


@pytest.mark.usefixtures("no_agreement_check")  # (a checked call is kept only after its check)
def test_kept_plans_span_at_most_max_plan_bytes(monkeypatch):
    """Finished collectives are kept by bytes as well as by shape: a large one pushes the oldest
    shapes out, and one larger than the bound is not kept at all."""
    import pycoll.planner as planner

    monkeypatch.setattr(planner, "MAX_PLAN_BYTES", 1000)
    teams = pycoll.local_teams(2)
    for count in (10, 20, 30, 100, 40, 200):  # float64: 80 ... 1600 bytes
        pycoll.wait_all([t.allreduce(np.ones(count)) for t in teams])
        p = teams[0].planner
        kept = [t for pool in p._plans.values() for t in pool]
        held = [planner.held_bytes(t) for t in kept]  # (rd's scratch: a buffer's worth, and the buffers)
        assert held == [t.nbytes + t.scratch_bytes for t in kept]  # (all under UNBIND_BYTES: bound)
        assert p._plan_bytes == sum(held) <= 1000, (count, p._plan_bytes)
    assert all(h <= 1000 for h in held) and kept, kept


@pytest.mark.usefixtures("no_agreement_check")
def test_a_large_call_repeated_keeps_its_collective_outside_the_pool(monkeypatch):
    """A collective holding more than the whole pool is kept alone, outside it, once its call
    repeats (its scratch is not mapped and faulted in again on every call); a large call made once
    is not kept, a large call of another shape replaces it, and closing releases it."""
    import pycoll.planner as planner

    monkeypatch.setattr(planner, "MAX_PLAN_BYTES", 1000)
    teams = pycoll.local_teams(2)
    p = teams[0].planner

    def call(count):
        reqs = [t.allreduce(np.ones(count), algorithm="rd") for t in teams]
        task = reqs[0].task
        out = pycoll.wait_all(reqs)
        assert all((o == 2).all() for o in out)
        return task

    call(500)  # 4000 B, scratch 4000: more than the pool
    assert p._large is None and p._plan_bytes == 0
    first = call(500)
    assert p._large is not None and p._large[1] is first and p._plan_bytes == 0
    assert call(500) is first and p._large[1] is first  # reused: the same task and scratch
    call(700)  # another large shape: the kept one goes, this one (made once) is not kept
    assert p._large is None and first.scratch_bytes == 0
    call(700)
    assert p._large is not None
    kept = p._large[1]
    for t in teams:
        t.close()
    assert p._large is None and kept.scratch_bytes == 0


def test_a_kept_collective_counts_only_what_it_holds(monkeypatch):
    """A kept collective that let go of its caller's buffers (they are of UNBIND_BYTES or more)
    holds only its scratch: a call whose buffers and scratch together exceed MAX_PLAN_BYTES, but
    whose scratch alone does not, is kept (counting the buffers too rebuilt an 8 MiB allreduce, and
    mapped its scratch afresh, on every call: 2.0 ms instead of 1.3)."""
    import pycoll.planner as planner

    monkeypatch.setattr(planner, "MAX_PLAN_BYTES", 1000)
    monkeypatch.setattr(planner, "UNBIND_BYTES", 512)
    teams = pycoll.local_teams(2)
    for _ in range(2):
        pycoll.wait_all([t.allreduce(np.ones(100), algorithm="rd", tag="held") for t in teams])  # 800 B
        p = teams[0].planner
        kept = [t for pool in p._plans.values() for t in pool]
        assert len(kept) == 1 and kept[0].nbytes == 800 and p._plan_bytes == kept[0].scratch_bytes <= 1000


@pytest.mark.usefixtures("no_agreement_check")  # (a checked call is kept only after its check)
@pytest.mark.parametrize("coll,alg", [("allreduce", "rd"), ("allreduce", "ring"), ("allreduce", "knomial"),
                                      ("alltoall", "bruck"), ("allgather", "ring")])
def test_kept_collectives_let_go_of_large_buffers(coll, alg, monkeypatch):
    """A finished collective kept for reuse does not keep its caller's large buffers alive (nor
    views of them), and the next call of its shape, rebound to new buffers, is right. (The calls a
    team remembers to spot repeats do keep theirs, up to MAX_REPEATED_BYTES: tests/unit/test_lean_path.py.)"""
    import gc
    import weakref

    import pycoll.persistent as persistent
    import pycoll.planner as planner

    monkeypatch.setattr(persistent, "MAX_REPEATED_BYTES", 0)

    n = 3
    count = planner.UNBIND_BYTES // 8 * n  # float64: a block per rank of at least UNBIND_BYTES
    teams = pycoll.local_teams(n)

    def call(r, team, x, out):
        if coll == "allreduce":
            return team.allreduce(x, out, algorithm=alg)
        return getattr(team, coll)(x if coll == "alltoall" else x[:count // n], out, algorithm=alg)

    for round_ in range(2):
        ins = [np.arange(count, dtype=np.float64) * (r + 1) + round_ for r in range(n)]
        outs = [np.zeros(count, np.float64) for _ in range(n)]
        reqs = [call(r, t, ins[r], outs[r]) for r, t in enumerate(teams)]
        pycoll.wait_all(reqs)
        if coll == "allreduce":
            want = [sum(ins)] * n
        elif coll == "alltoall":
            m = count // n
            want = [np.concatenate([x[r * m:(r + 1) * m] for x in ins]) for r in range(n)]
        else:
            want = [np.concatenate([x[:count // n] for x in ins])] * n
        for r in range(n):
            np.testing.assert_array_equal(outs[r], want[r])
        tasks = [req.task for req in reqs]
        del reqs
        kept = [t for pool in teams[0].planner._plans.values() for t in pool]
        assert tasks[0] in kept, "the finished collective was not kept for reuse"
        refs = [weakref.ref(a) for a in ins + outs]
        del ins, outs, want
        gc.collect()
        assert all(ref() is None for ref in refs), f"{coll}:{alg} kept its caller's buffers alive"


@pytest.mark.parametrize("alg", ALGS + [None])
def test_persistent_allreduce_started_three_times_with_refilled_buffers(alg):
    n = 3
    teams = pycoll.local_teams(n)
    bufs = [np.zeros(5000, np.float32) for _ in range(n)]
    outs = [np.zeros(5000, np.float32) for _ in range(n)]
    pers = [t.allreduce_init(bufs[r], outs[r], algorithm=alg) for r, t in enumerate(teams)]
    tasks = set()
    for run in range(3):
        for r in range(n):
            bufs[r][:] = r + 10 * run  # refill between starts
        reqs = [p.start() for p in pers]
        pycoll.wait_all(reqs)
        tasks.add(id(pers[0].task))
        assert all((o == sum(r + 10 * run for r in range(n))).all() for o in outs)
    assert len(tasks) == 1  # built once
    with pytest.raises(RuntimeError, match="wait\\(\\) before start"):
        teams[0].allreduce_init(bufs[0]).wait()
    p = teams[0].allreduce_init(bufs[0], timeout=5)
    p.start()
    with pytest.raises(RuntimeError, match="in progress"):
        p.start()
    for q in pers:
        q.free()


def test_persistent_bcast_and_barrier():
    teams = pycoll.local_teams(4)
    bufs = [np.zeros(100, np.int64) for _ in teams]
    pb = [t.bcast_init(b, root=2) for t, b in zip(teams, bufs)]
    pbar = [t.barrier_init() for t in teams]
    for run in range(3):
        bufs[2][:] = run + 1
        pycoll.wait_all([p.start() for p in pb] + [p.start() for p in pbar])
        assert all((b == run + 1).all() for b in bufs)


@pytest.mark.parametrize("how", ["checked", "persistent", "partitioned"])
def test_collectives_not_kept_free_their_scratch_without_the_garbage_collector(how, monkeypatch):
    """A schedule is a reference cycle (its children point back at it): a collective that is not
    kept for reuse must release its scratch when it is let go, not at the next garbage collection
    (a soak of random calls held 17 MiB that way). A call behind the agreement check's exchange
    (``PYCOLL_CHECK=all``) returns to the pool afterwards like any other."""
    import gc
    import weakref

    import pycoll.algorithms.allreduce_ring as ring
    from pycoll.agreement import CheckedCall
    from pycoll.buffers import scratch_array

    refs = []  # the ring allreduces' mapped scratch, weakly

    def mapped(size, dtype):
        arr = scratch_array(size, dtype)
        refs.append(weakref.ref(arr.base))
        return arr

    monkeypatch.setattr(ring, "scratch_array", mapped)
    if how == "checked":
        monkeypatch.setenv("PYCOLL_CHECK", "all")
    n, count = 3, 3 * (256 << 10) // 8  # float64: each rank's block maps its scratch (>= 128 KiB)
    ctx = pycoll.Context(partition_bytes=(256 << 10) if how == "partitioned" else None)
    teams = pycoll.local_teams(n, ctx)
    ins = [np.arange(count, dtype=np.float64) * (r + 1) for r in range(n)]
    gc.collect()
    gc.disable()
    try:
        outs = [np.zeros(count) for _ in range(n)]
        if how == "persistent":
            pers = [t.allreduce_init(ins[r], outs[r], algorithm="ring") for r, t in enumerate(teams)]
            pycoll.wait_all([p.start() for p in pers])
            del pers
        else:
            reqs = [t.allreduce(ins[r], outs[r], algorithm="ring") for r, t in enumerate(teams)]
            pycoll.wait_all(reqs)
            task = reqs[0].task
            if how == "checked":
                assert isinstance(task, CheckedCall)
                kept = [t for pool in teams[0].planner._plans.values() for t in pool]
                assert task.task in kept, "the collective run behind the check was not kept for reuse"
                for team in teams:
                    team.planner.close()  # (lets the kept ones go: their finalize frees the scratch)
            del reqs, task
        assert refs
        for r in range(n):
            np.testing.assert_array_equal(outs[r], sum(ins))
        assert all(ref() is None for ref in refs), f"{how}: scratch held until the garbage collector runs"
    finally:
        gc.enable()


def test_ring_scratch_is_no_larger_than_the_buffer():
    """A ring allreduce's scratch is n - 1 fragments per slot: a fragment is cut to the block, so
    a small call does not hold (and its kept schedule keep) a whole fragment_bytes of scratch."""
    n, count = 4, 1000
    teams = pycoll.local_teams(n)
    ins = [np.full(count, r + 1, np.float32) for r in range(n)]
    reqs = [t.allreduce(ins[r], algorithm="ring") for r, t in enumerate(teams)]
    pycoll.wait_all(reqs)
    ring = reqs[0].task
    ring = getattr(ring, "task", ring)  # (behind the agreement check)
    assert all((x == sum(range(1, n + 1))).all() for x in ins)
    scratch = ring.scratch_bytes
    assert 0 < scratch <= count * 4, f"{scratch} B of scratch for a {count * 4} B allreduce"


def test_a_dropped_persistent_collective_still_runs_its_queued_start():
    """A persistent collective dropped while its last start waits for credit (queued, not yet in
    progress) releases nothing that start needs: it still runs, on the same buffers."""
    import gc

    n = 2
    teams = pycoll.local_teams(n, pycoll.Context(credit_bytes=1024))
    big = [np.ones(4096) for _ in range(n)]
    bufs = [np.full(2000, r + 1.0) for r in range(n)]
    outs = [np.zeros(2000) for _ in range(n)]
    pers = [t.allreduce_init(bufs[r], outs[r], algorithm="rd") for r, t in enumerate(teams)]
    pycoll.wait_all([p.start() for p in pers])
    ahead = [t.allreduce(big[r], algorithm="rd") for r, t in enumerate(teams)]  # holds the credit
    reqs = [p.start() for p in pers]
    assert all(p.task.state is TaskState.NOT_READY for p in pers)  # queued behind it
    for out in outs:
        out[:] = 0
    del pers
    gc.collect()
    pycoll.wait_all(ahead + reqs)
    for out in outs:
        np.testing.assert_array_equal(out, 3.0)
