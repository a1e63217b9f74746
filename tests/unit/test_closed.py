"""Closed means closed, in process: every collective of the table, in both forms, raises
``pycoll.ClosedError`` on a closed team (and on a revoked one, RevokedError) before anything is
sent."""

import numpy as np
import pytest

import pycoll
from pycoll.collectives import TABLE


def _args(coll, n):
    x = np.ones(4 * n, np.float32)
    counts = [4] * n
    return {
        "allreduce": (x,), "bcast": (x,), "reduce": (x, np.empty_like(x)), "allgather": (x[:4], x.copy()),
        "allgatherv": (x[:4], x.copy(), counts), "reduce_scatter": (x, np.empty(4, np.float32)),
        "reduce_scatterv": (x, np.empty(4, np.float32), counts), "alltoall": (x, x.copy()),
        "alltoallv": (x, x.copy(), counts, counts), "gather": (x[:4], x.copy()),
        "gatherv": (x[:4], x.copy(), counts), "scatter": (x, np.empty(4, np.float32)),
        "scatterv": (x, np.empty(4, np.float32), counts), "scan": (x,), "exscan": (x,), "barrier": (),
    }[coll]


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_every_collective_refused_after_close(row):
    teams = pycoll.local_teams(2)
    reqs = [getattr(t, row.name)(*_args(row.name, 2)) for t in teams]
    for req in reqs:
        req.wait(timeout=10)
    kept = getattr(teams[0], f"{row.name}_init")(*_args(row.name, 2))
    for t in teams:
        t.close()
    with pytest.raises(pycoll.ClosedError, match="closed"):
        getattr(teams[0], row.name)(*_args(row.name, 2))
    with pytest.raises(pycoll.ClosedError):
        kept.start()
    with pytest.raises(pycoll.ClosedError):
        getattr(teams[0], f"{row.name}_init")(*_args(row.name, 2)).start()


def test_a_revoked_team_stays_revoked_when_closed():
    teams = pycoll.local_teams(2)
    teams[0].revoke("stop")
    teams[0].close()
    assert teams[0].revoked
    with pytest.raises(pycoll.RevokedError, match="stop"):
        teams[0].allreduce(np.ones(2))
