"""Many outstanding collectives of mixed kinds, sizes and priorities, tagged and posted in a
different order on every rank, with ample and with small credit."""

import numpy as np
import pytest

import pycoll

KINDS = ["allreduce", "bcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather", "scatter",
         "barrier"]


def post(team, kind, k, count, bufs):
    n, r = team.size, team.rank
    tag = ("t", k)
    prio = int(np.random.default_rng(1000 * r + k).integers(0, 8))
    if kind == "allreduce":
        bufs[k] = np.full(count, float(r + k))
        return team.allreduce(bufs[k], tag=tag, priority=prio)
    if kind == "bcast":
        bufs[k] = np.full(count, float(k) if r == k % n else -1.0)
        return team.bcast(bufs[k], root=k % n, tag=tag, priority=prio)
    if kind == "reduce":
        bufs[k] = np.zeros(count)
        return team.reduce(np.full(count, float(r + k)), bufs[k], root=k % n, tag=tag, priority=prio)
    if kind == "allgather":
        bufs[k] = np.zeros(n * count)
        return team.allgather(np.full(count, float(r + k)), bufs[k], tag=tag, priority=prio)
    if kind == "reduce_scatter":
        bufs[k] = np.zeros(count)
        return team.reduce_scatter(np.full(n * count, float(r + k)), bufs[k], tag=tag, priority=prio)
    if kind == "alltoall":
        bufs[k] = np.zeros(n * count)
        return team.alltoall(np.repeat(np.arange(n, dtype=float) + 10 * r + k, count), bufs[k], tag=tag,
                             priority=prio)
    if kind == "gather":
        bufs[k] = np.zeros(n * count)
        return team.gather(np.full(count, float(r + k)), bufs[k] if r == k % n else None, root=k % n, tag=tag,
                           priority=prio)
    if kind == "scatter":
        bufs[k] = np.zeros(count)
        whole = np.repeat(np.arange(n, dtype=float) + k, count) if r == k % n else None
        return team.scatter(whole, bufs[k], root=k % n, tag=tag, priority=prio)
    bufs[k] = None
    return team.barrier(tag=tag, priority=prio)


def check(team, kind, k, count, buf):
    n, r = team.size, team.rank
    total = sum(rr + k for rr in range(n))
    if kind == "allreduce":
        assert (buf == total).all()
    elif kind == "bcast":
        assert (buf == k).all()
    elif kind == "reduce" and r == k % n:
        assert (buf == total).all()
    elif kind == "allgather":
        assert (buf == np.repeat(np.arange(n, dtype=float) + k, count)).all()
    elif kind == "reduce_scatter":
        assert (buf == total).all()
    elif kind == "alltoall":
        assert (buf == np.repeat(np.arange(n, dtype=float) * 10 + r + k, count)).all()
    elif kind == "gather" and r == k % n:
        assert (buf == np.repeat(np.arange(n, dtype=float) + k, count)).all()
    elif kind == "scatter":
        assert (buf == r + k).all()


def plan(total=1000):
    rng = np.random.default_rng(7)
    sizes = [1, 3, 100, 2000]
    return [(KINDS[int(rng.integers(0, len(KINDS)))], int(rng.choice(sizes))) for _ in range(total)]


# Under a small credit, 200 for now: finding the collectives that peers have started scans every
# credit-blocked one, which grows quadratically (to be indexed by message key).
@pytest.mark.parametrize("credit,total", [(0, 1000), (4096, 200)])
def test_mixed_collectives_in_different_orders_on_four_ranks(credit, total):
    ctx = pycoll.Context(credit_bytes=credit, partition_bytes=0, timeout=120)
    teams = pycoll.local_teams(4, ctx)
    work = plan(total)
    bufs = [dict() for _ in teams]
    reqs = [[] for _ in teams]
    for r, team in enumerate(teams):
        for k in np.random.default_rng(r).permutation(len(work)):
            kind, count = work[k]
            reqs[r].append(post(team, kind, int(k), count, bufs[r]))
    pycoll.wait_all([q for rq in reqs for q in rq])
    for r, team in enumerate(teams):
        for k, (kind, count) in enumerate(work):
            check(team, kind, k, count, bufs[r][k])
    if credit:
        assert ctx.stats["credit_waits"] > 0
