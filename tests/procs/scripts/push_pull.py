"""push_pull on real ranks (workers, and servers when PYCOLL_NUM_SERVERS is set):
python push_pull.py MODE.

sync     every float dtype, sizes 0 to 64 MiB (float32), in place and out of place, SUM and mean,
         against numpy; bad input
api      allreduce(algorithm="push_pull"), the scheduling layer over push_pull, pycoll.mpi.Comm
async    workers push deltas and pull the current values without waiting for a slow worker; the
         final values are the sum of every delta
"""

import sys
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

from pycoll import Team
from tests.rank import run_rank

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


def values(count: int, rank: int, dt) -> np.ndarray:
    return ((np.arange(count) % 11) + rank).astype(dt)


def make_team(comm: MPI.Comm):
    """The workers' team; None on a server rank (it served inside until the workers were done)."""
    try:
        return Team.from_mpi(comm)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
        return None


def sync(comm: MPI.Comm) -> None:
    team = make_team(comm)
    if team is None:
        return
    n, rank = team.size, team.rank
    assert team.role == "worker" and team.workers == list(range(n))
    assert team.servers == list(range(n, comm.Get_size())), team.servers
    for dt in DTYPES:
        for count in (0, 1, 7, 1000, (1 << 18) + 3):
            x = values(count, rank, dt)
            want = sum(values(count, r, np.float64) for r in range(n))
            team.push_pull(x, name=f"x{count}{np.dtype(dt).name}").wait(timeout=60)
            tol = 1e-2 if np.dtype(dt).itemsize == 2 else 1e-6
            assert np.allclose(x.astype(np.float64), want, rtol=tol), (dt, count)
            out = np.empty_like(x)
            src = values(count, rank, dt)
            team.push_pull(src, out, name=f"y{count}{np.dtype(dt).name}", average=True).wait(timeout=60)
            assert np.allclose(out.astype(np.float64), want / n, rtol=tol), (dt, count, "avg")
            assert np.array_equal(src, values(count, rank, dt)), "out of place changed the input"
    big = values(16 << 20, rank, np.float32)  # 64 MiB
    for _ in range(2 if n + len(team.servers) <= 4 else 1):  # rounds of one tensor
        big[:] = values(16 << 20, rank, np.float32)
        team.push_pull(big, name="big").wait(timeout=120)
        assert np.array_equal(big, sum(values(16 << 20, r, np.float32) for r in range(n))), "64 MiB"
    for bad, err in (({"name": ""}, ValueError), ({"name": 3}, ValueError)):
        try:
            team.push_pull(np.ones(3), **bad)
        except err:
            pass
        else:
            raise AssertionError(f"push_pull accepted {bad}")
    try:
        team.push_pull(np.ones(5, np.float32), name="big")
    except ValueError as exc:
        assert "keeps its layout" in str(exc)
    else:
        raise AssertionError("a name changed its layout")
    try:
        team.push_pull(np.ones(3, np.int32), np.ones(4, np.int32), name="mismatch")
    except ValueError:
        pass
    else:
        raise AssertionError("mismatched buffers accepted")


def comm_of(team):
    return team.comm  # the workers' MPI communicator


def asynchronous(comm: MPI.Comm) -> None:
    team = make_team(comm)
    if team is None:
        return
    n, rank = team.size, team.rank
    steps = 6
    for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        counts = (0, 1, 1000, (1 << 16) + 5) + ((16 << 20,) if dt is np.float32 else ())  # 0 to 64 MiB
        for count in counts:
            name = f"w{count}{np.dtype(dt).name}"
            out = np.empty(count, dt)
            team.push_pull(np.zeros(count, dt), out, name=name, mode="async").wait(timeout=60)  # services up
            slow = n > 1 and dt is np.float32 and count == 1000
            woke = 0.0
            for step in range(steps if count < (1 << 20) else 1):
                if slow and rank == n - 1 and step == 1:
                    time.sleep(0.8)  # a slow worker: the others go on without it
                    woke = time.monotonic()  # one clock for every process of the machine
                team.push_pull(np.full(count, rank + 1, dt), out, name=name, mode="async").wait(timeout=60)
            done = time.monotonic()
            if slow:
                times = comm_of(team).allgather((done, woke))
                assert times[0][0] < times[n - 1][1], f"worker 0 waited for the slow worker: {times}"
            team.barrier().wait(timeout=60)
            team.push_pull(np.zeros(count, dt), out, name=name, mode="async").wait(timeout=60)
            want = (steps if count < (1 << 20) else 1) * n * (n + 1) / 2
            assert np.all(out.astype(np.float64) == want), (dt, count, out[:3], want)
    try:
        team.push_pull(np.ones(3), name="x", mode="async", average=True)
    except ValueError:
        pass
    else:
        raise AssertionError("average accepted in async mode")
    team.close()  # serves the others until every worker is here


def api(comm: MPI.Comm) -> None:
    from pycoll import ReduceOp
    from pycoll.mpi import Comm
    from pycoll.scheduling import Scheduler

    team = make_team(comm)
    if team is None:
        return
    n, rank = team.size, team.rank
    want = lambda count: sum(values(count, r, np.float64) for r in range(n))  # noqa: E731
    x = values(5000, rank, np.float32)
    team.allreduce(x, algorithm="push_pull").wait(timeout=60)  # untagged: named by sequence
    assert np.allclose(x, want(5000))
    y = values(5000, rank, np.float64)
    team.allreduce(y, op=ReduceOp.AVG, algorithm="push_pull", tag="grad").wait(timeout=60)
    assert np.allclose(y, want(5000) / n)
    try:
        team.allreduce(y, op=ReduceOp.MAX, algorithm="push_pull")
    except ValueError:
        pass
    else:
        raise AssertionError("push_pull accepted MAX")
    # the scheduling layer over push_pull: tensors ready in a per-rank random order, small credit
    sched = Scheduler(team, partition_bytes=8192, credit_bytes=8192, tuning="off", collective="push_pull",
                      timeout=60)
    rng = np.random.default_rng(rank)
    arrays = {f"t{i}": values(1000 * (i + 1), rank, np.float32) for i in range(6)}
    handles = [sched.submit(k, a, priority=i, ready=False) for i, (k, a) in enumerate(arrays.items())]
    for k in rng.permutation(list(arrays)):
        sched.notify_ready(str(k))
    for h, (k, a) in zip(handles, arrays.items()):
        h.wait(timeout=60)
        assert np.allclose(a, want(a.size)), k
    # pycoll.mpi.Comm passes the algorithm through (on the workers' communicator)
    c = Comm(team.comm)
    z = values(333, rank, np.float32)
    out = np.empty_like(z)
    c.Allreduce(z, out, op=MPI.SUM, algorithm="push_pull", tag="mpi")
    assert np.allclose(out, want(333))


if __name__ == "__main__":
    run_rank({"sync": sync, "async": asynchronous, "api": api}[sys.argv[1]], MPI.COMM_WORLD)
