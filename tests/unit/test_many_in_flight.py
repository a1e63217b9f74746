"""Many outstanding collectives of mixed kinds (every collective, v-variants too), sizes and
priorities, tagged and posted in a different order on every rank, with ample credit, a credit
smaller than most collectives, and a credit of one byte (one collective at a time unless a peer
started another)."""

import numpy as np
import pytest

import pycoll
from tests.reference import check_mixed, mixed_plan, post_mixed


@pytest.mark.parametrize("credit,total", [(0, 1000), (4096, 1000), (1, 300)])
def test_mixed_collectives_in_different_orders_on_four_ranks(credit, total):
    ctx = pycoll.Context(credit_bytes=credit, partition_bytes=0, timeout=120)
    teams = pycoll.local_teams(4, ctx)
    work = mixed_plan(total)
    bufs = [dict() for _ in teams]
    reqs = [[] for _ in teams]
    for r, team in enumerate(teams):
        for k in np.random.default_rng(r).permutation(len(work)):
            kind, count = work[k]
            reqs[r].append(post_mixed(team, kind, int(k), count, bufs[r]))
    pycoll.wait_all([q for rq in reqs for q in rq])
    for r, team in enumerate(teams):
        for k, (kind, count) in enumerate(work):
            check_mixed(team, kind, k, count, bufs[r][k])
    if credit:
        assert ctx.stats["credit_waits"] > 0
