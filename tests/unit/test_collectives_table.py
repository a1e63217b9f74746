"""The table of collectives drives every front end: Team methods, pycoll.mpi.Comm, the torch
backend and pycoll perf all follow its rows."""

import inspect

import numpy as np
import pytest

import pycoll
from pycoll import calls
from pycoll.collectives import COLLECTIVES, TABLE, Collective, get
from pycoll.ops import ReduceOp


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_team_methods_come_from_the_row(row: Collective) -> None:
    start, init = getattr(pycoll.Team, row.name), getattr(pycoll.Team, f"{row.name}_init")
    for method in (start, init):
        params = list(inspect.signature(method).parameters)
        assert params[1:1 + len(row.params)] == row.params
        assert {"priority", "tag", "algorithm", "timeout", "options"} <= set(params)
    assert row.doc in start.__doc__


@pytest.mark.parametrize("row", [r for r in TABLE if r.mpi], ids=lambda r: r.name)
def test_comm_has_mpi4py_three_forms(row: Collective) -> None:
    from pycoll.mpi import Comm

    i_name = f"I{row.mpi[0].lower()}{row.mpi[1:]}"
    for name in (row.mpi, i_name, f"{row.mpi}_init"):
        assert callable(getattr(Comm, name)), name
        assert list(inspect.signature(getattr(Comm, name)).parameters)[1:-1] == list(row.mpi_params)
    for p in row.mpi_params:  # every MPI parameter lands on a parameter of the collective
        name = row.mpi_rename.get(p, p)
        assert name in row.params or p in ("op", "root"), (row.name, p)
    for p, (c, d) in row.mpi_vector.items():
        assert {p, c, d} <= set(row.params)


def test_torch_backend_serves_every_torch_name() -> None:
    backend = pytest.importorskip("pycoll.torch.backend", reason="torch is not installed")
    for row in TABLE:
        if row.torch is not None:
            method = backend.TORCH_METHODS[row.torch]
            assert callable(getattr(backend.ProcessGroupPycoll, method)), (row.torch, method)


def test_perf_runs_every_row_and_push_pull() -> None:
    from pycoll import perf

    assert set(perf.ALL) == set(COLLECTIVES)
    assert set(perf.COLLS) == set(COLLECTIVES) | {"push_pull"}


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_references_match_the_collectives_on_local_teams(row: Collective) -> None:
    """Each row's numpy reference is what the collective computes (3 in-process ranks)."""
    n, root, op = 3, 1, ReduceOp.SUM
    teams = pycoll.local_teams(n)
    m = 4
    total = m * n
    inputs = [np.arange(m if row.send == "block" else total, dtype=np.float64) * (r + 1) for r in range(n)]
    outs, reqs = [], []
    for r, team in enumerate(teams):
        here = {"op": op, "root": root}
        for p in row.params:
            if p in row.root_only and r != root:
                here[p] = None
            elif p == "buf":
                here[p] = inputs[root].copy() if r == root else np.zeros(total)
            elif p == "sendbuf":
                here[p] = inputs[r]
            elif p == "recvbuf":
                here[p] = np.zeros(m if row.recv == "block" else total)
            elif p.endswith("counts"):
                here[p] = [m] * n
        outs.append(here.get("recvbuf", here.get("buf")))
        reqs.append(getattr(team, row.name)(**{p: here[p] for p in row.params if p in here}))
    pycoll.wait_all(reqs)
    for r in range(n):
        want = row.reference(inputs, r, n, op, root)
        if want is not None:
            np.testing.assert_array_equal(outs[r], want, err_msg=f"{row.name} rank {r}")


def test_unknown_collective_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown collective 'allreduc'"):
        get("allreduc")
    team = pycoll.local_teams(1)[0]
    with pytest.raises(ValueError, match="unknown collective"):
        team.submit("allreduc", np.zeros(1))


def test_bad_arguments_raise_before_anything_is_sent() -> None:
    team = pycoll.local_teams(2)[0]
    with pytest.raises(ValueError, match="must match"):
        team.allreduce(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="root 5"):
        calls.bcast(0, 2, np.zeros(1), 5)
    assert team.next_sequence() == 0  # no message key was taken
