"""Mixed collectives for the many-in-flight tests: collective k of a plan, posted and checked on
any team (in-process or one rank of a process job). Every rank computes the same plan; inputs
depend on (rank, k) so that every result is known in closed form."""

import numpy as np

KINDS = ["allreduce", "bcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather", "scatter",
         "barrier", "allgatherv", "reduce_scatterv", "alltoallv", "gatherv", "scatterv"]


def plan(total=1000, seed=7):
    """``total`` (kind, count) pairs, the same on every rank."""
    rng = np.random.default_rng(seed)
    sizes = [1, 3, 100, 2000]
    return [(KINDS[int(rng.integers(0, len(KINDS)))], int(rng.choice(sizes))) for _ in range(total)]


def vcounts(n, k, count):
    """Unequal counts of a v-collective: rank r's block holds (r + k) % 3 * count // 2 elements."""
    return [(r + k) % 3 * count // 2 for r in range(n)]


def post(team, kind, k, count, bufs, tagged=True, priority=None):
    """Start collective ``k`` on ``team``; its output buffer goes to ``bufs[k]``."""
    n, r = team.size, team.rank
    if priority is None:
        priority = int(np.random.default_rng(1000 * r + k).integers(0, 8))
    kw = {"tag": ("t", k) if tagged else None, "priority": priority}
    root = k % n
    if kind == "allreduce":
        bufs[k] = np.full(count, float(r + k))
        return team.allreduce(bufs[k], **kw)
    if kind == "bcast":
        bufs[k] = np.full(count, float(k) if r == root else -1.0)
        return team.bcast(bufs[k], root=root, **kw)
    if kind == "reduce":
        bufs[k] = np.zeros(count)
        return team.reduce(np.full(count, float(r + k)), bufs[k], root=root, **kw)
    if kind == "allgather":
        bufs[k] = np.zeros(n * count)
        return team.allgather(np.full(count, float(r + k)), bufs[k], **kw)
    if kind == "reduce_scatter":
        bufs[k] = np.zeros(count)
        return team.reduce_scatter(np.full(n * count, float(r + k)), bufs[k], **kw)
    if kind == "alltoall":
        bufs[k] = np.zeros(n * count)
        return team.alltoall(np.repeat(np.arange(n, dtype=float) + 10 * r + k, count), bufs[k], **kw)
    if kind == "gather":
        bufs[k] = np.zeros(n * count)
        return team.gather(np.full(count, float(r + k)), bufs[k] if r == root else None, root=root, **kw)
    if kind == "scatter":
        bufs[k] = np.zeros(count)
        whole = np.repeat(np.arange(n, dtype=float) + k, count) if r == root else None
        return team.scatter(whole, bufs[k], root=root, **kw)
    counts = vcounts(n, k, count)
    if kind == "allgatherv":
        bufs[k] = np.zeros(sum(counts))
        return team.allgatherv(np.full(counts[r], float(r + k)), bufs[k], counts, **kw)
    if kind == "reduce_scatterv":
        bufs[k] = np.zeros(counts[r])
        return team.reduce_scatterv(np.full(sum(counts), float(r + k)), bufs[k], counts, **kw)
    if kind == "alltoallv":  # rank i sends counts[j] elements valued 10 i + j + k to rank j
        send = [counts[j] for j in range(n)]
        recv = [counts[r]] * n
        bufs[k] = np.zeros(sum(recv))
        return team.alltoallv(np.repeat(np.arange(n, dtype=float) + 10 * r + k, send), bufs[k], send, recv,
                              **kw)
    if kind == "gatherv":
        bufs[k] = np.zeros(sum(counts))
        return team.gatherv(np.full(counts[r], float(r + k)), bufs[k] if r == root else None,
                            counts if r == root else None, root=root, **kw)
    if kind == "scatterv":
        bufs[k] = np.zeros(counts[r])
        whole = np.repeat(np.arange(n, dtype=float) + k, counts) if r == root else None
        return team.scatterv(whole, bufs[k], counts if r == root else None, root=root, **kw)
    bufs[k] = None
    return team.barrier(**kw)


def check(team, kind, k, count, buf):
    """Assert that collective ``k``'s output on this rank is right."""
    n, r = team.size, team.rank
    root = k % n
    total = sum(rr + k for rr in range(n))
    counts = vcounts(n, k, count)
    if kind in ("allreduce", "reduce_scatter", "reduce_scatterv") or (kind == "reduce" and r == root):
        want = total
    elif kind == "bcast":
        want = k
    elif kind in ("allgather", "gather"):
        want = np.repeat(np.arange(n, dtype=float) + k, count)
    elif kind in ("allgatherv", "gatherv"):
        want = np.repeat(np.arange(n, dtype=float) + k, counts)
    elif kind == "alltoall":
        want = np.repeat(np.arange(n, dtype=float) * 10 + r + k, count)
    elif kind == "alltoallv":
        want = np.repeat(np.arange(n, dtype=float) * 10 + r + k, counts[r])
    elif kind in ("scatter", "scatterv"):
        want = r + k
    else:
        return
    if kind in ("gather", "gatherv") and r != root:
        return
    assert np.array_equal(buf, np.broadcast_to(want, buf.shape)), (kind, k, count, r)
