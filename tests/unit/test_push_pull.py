"""BytePS push-sum-pull: the placement (BytePS's optimal split) and push_pull in process. On
workers with and without summation servers: tests/procs/test_push_pull.py and
tests/procs/torch/test_push_pull.py."""

import numpy as np
import pytest

import pycoll
from pycoll.ps.placement import plan, shares, slots


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
