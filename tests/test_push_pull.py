"""BytePS push-sum-pull: the placement (BytePS's optimal split) and push_pull against numpy on
workers with and without summation servers."""

import numpy as np
import pytest

import pycoll
from pycoll.ps.placement import plan, shares, slots
from tests.mpirun import run_ranks


@pytest.mark.parametrize("n,k", [(2, 0), (2, 1), (3, 1), (4, 0), (4, 1), (4, 2), (4, 4), (8, 3)])
def test_placement_gives_bytepss_shares(n, k):
    """At 64 MiB every service sums exactly its share: 2(n-1)M/(n^2+kn-2k) per server,
    (n-k)M/(n^2+kn-2k) per colocated service (k = n: servers only; k = 0: all-reduce's n equal parts)."""
    count, itemsize = 16 << 20, 4
    parts = plan("w", count, itemsize, n, k, 4 << 20)
    assert sum(p.hi - p.lo for p in parts) == count and parts[0].lo == 0
    assert all(a.hi == b.lo for a, b in zip(parts, parts[1:]))
    assert all((p.hi - p.lo) * itemsize <= 4 << 20 for p in parts)
    per_server, per_worker = shares(n, k)
    load = {}
    for p in parts:
        load[p.service] = load.get(p.service, 0) + p.hi - p.lo
    for service, elems in load.items():
        want = (per_server if service.server else per_worker) * count
        assert abs(elems - want) <= len(parts), (service, elems, want)
    if k == 0:
        assert per_worker == pytest.approx(1 / n)
    if k == n:
        assert per_worker == 0 and per_server == pytest.approx(1 / k)
    assert sum(1 for s in load if s.server) == k


def test_placement_spreads_small_tensors_and_is_deterministic():
    n, k = 4, 2
    total = slots(n, k)[0]
    owners = {plan(f"t{i}", 10, 4, n, k, 4 << 20)[0].service for i in range(200)}
    assert len(owners) == n + k  # one-part tensors land on every service
    assert plan("same", 12345, 8, n, k, 1 << 16) == plan("same", 12345, 8, n, k, 1 << 16)
    assert total == n * n + k * n - 2 * k
    with pytest.raises(ValueError):
        slots(0, 1)


def test_push_pull_in_process():
    import threading

    teams = pycoll.local_teams(3)
    results = [None] * 3

    def run(team):
        x = np.arange(300_000, dtype=np.float64) + team.rank
        team.push_pull(x, name="w").wait(timeout=30)
        results[team.rank] = x

    threads = [threading.Thread(target=run, args=(t,)) for t in teams]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    want = sum(np.arange(300_000, dtype=np.float64) + r for r in range(3))
    assert all(np.array_equal(r, want) for r in results)


@pytest.mark.parametrize("n,k", [(2, 0), (2, 1), (3, 1), (4, 0), (4, 1), (4, 2), (4, 4)])
def test_push_pull_sync_matches_numpy(n, k):
    run_ranks(n + k, "tests/mpi/push_pull.py", "sync", timeout=180,
              env={"PYCOLL_NUM_SERVERS": str(k)})


@pytest.mark.parametrize("n,k", [(2, 0), (2, 1), (3, 1), (4, 0), (4, 1), (4, 2), (4, 4)])
def test_push_pull_async(n, k):
    """Deltas added at once, current values pulled without waiting for a slow worker."""
    run_ranks(n + k, "tests/mpi/push_pull.py", "async", timeout=120, env={"PYCOLL_NUM_SERVERS": str(k)})


@pytest.mark.parametrize("n,k", [(3, 0), (2, 1)])
def test_push_pull_as_allreduce_algorithm_scheduler_and_comm(n, k):
    run_ranks(n + k, "tests/mpi/push_pull.py", "api", timeout=120, env={"PYCOLL_NUM_SERVERS": str(k)})


def test_push_pull_in_torch():
    pytest.importorskip("torch", reason="torch is not installed")
    from tests.torchrun import run_torch

    run_torch(2, "tests/torch/push_pull.py", timeout=90)


def test_push_pull_in_torch_with_servers():
    """pycoll run -n 2 --servers 1 with a torch script: WORLD_SIZE counts the workers only, and
    pg.push_pull goes through the server."""
    pytest.importorskip("torch", reason="torch is not installed")
    import subprocess
    import sys

    from tests.mpirun import ROOT

    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pycoll.cli", "run", "-n", "2", "--servers", "1", "--timeout", "90", "--",
           sys.executable, "tests/torch/push_pull.py"]
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "RANK 0 OK" in out and "RANK 1 OK" in out, out[-4000:]
