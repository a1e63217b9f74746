"""The short path of small collectives on a shared segment (2+ ranks on one host), one check per
mode (argv[1]):

* ``persistent``: persistent allreduce and bcast started many times, buffers refilled between
  starts; ``team.allreduce``/``team.bcast`` and ``pycoll.mpi.Comm.Allreduce`` on the same arrays;
* ``mixed``: tagged allreduces posted in a different order on each rank under a credit of one of
  them, with untagged segment collectives (the short path) posted in between, all correct;
* ``timeout``: a segment collective whose peer never calls fails with TimeoutError naming what it
  waited on, within its timeout, on the rank that called it (no hang);
* ``repeated``: calls repeated with the same arguments (team methods and ``pycoll.mpi.Comm``) run
  as persistent collectives in the engine's express lane, with refilled buffers, priorities,
  in-flight repeats, an ndarray whose dtype changed in place, alternating buffers; rank 0 repeats
  while rank 1 makes new buffers every time, and a point-to-point collective after them still
  matches (the sequence numbers stayed in step);
* ``repeat-timeout``: an express-lane repeat whose peer never calls fails with TimeoutError
  within the engine's timeout;
* ``lane-mismatch``: repeats in the express lane that agree, then one whose op differs on rank 1
  at its 50th run: MismatchError on both ranks, and every later call raises it.

Under ``PYCOLL_TLS=mpi`` (no segment) ``repeated``, ``repeat-timeout`` and ``lane-mismatch`` run
over MPI's point to point: a repeat runs in the step task's express lane (``ProgramLane``, which
``StepTask.express_run`` serves).
* ``owed-timeout`` (3 ranks): ranks 1 and 2 gather to rank 0, which never calls, going on without
  it (past the segment's first collectives); rank 1's next collective, a bcast from rank 2, has
  its data but waits to check that gather's call against the root's: TimeoutError naming the
  earlier gather and its root.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll.mpi import Comm
from pycoll.team import Team
from tests.rank import run_rank

#: Whether the team has a segment (not under ``PYCOLL_TLS=mpi``).
SEGMENT = os.environ.get("PYCOLL_TLS") != "mpi"


def persistent(team: Team) -> None:
    n, r = team.size, team.rank
    x = np.zeros(2, np.float32)
    y = np.zeros(2, np.float32)
    b = np.zeros(3, np.float64)
    pa = team.allreduce_init(x, y)
    pb = team.bcast_init(b, root=n - 1)
    for i in range(300):
        x[:] = (r + 1) * i
        pa.start().wait()
        assert (y == sum(q + 1 for q in range(n)) * i).all(), (i, y)
        b[:] = i + 0.5 if r == n - 1 else -1
        pb.start().wait()
        assert (b == i + 0.5).all(), (i, b)
    assert pa.task is not None and "shm" in pa.task.name, pa.task
    for i in range(300):  # the same arrays through the non-persistent calls: the pooled tasks
        x[:] = r + i
        assert team.allreduce(x, y).wait() is y and (y == sum(q + i for q in range(n))).all()
        b[:] = i if r == 0 else -1
        team.bcast(b).wait()
        assert (b == i).all()
    comm = Comm(MPI.COMM_WORLD)
    for i in range(100):
        x[:] = r * i
        comm.Allreduce(x, y, op=MPI.SUM)
        assert (y == sum(q * i for q in range(n))).all()
        comm.Allreduce(MPI.IN_PLACE, x, op=MPI.MAX)
        assert (x == (n - 1) * i).all()
    comm.team.close()


def mixed(team: Team) -> None:
    n, r = team.size, team.rank
    order = list(range(6)) if r % 2 == 0 else list(reversed(range(6)))
    for rnd in range(5):
        reqs, bufs = [], {}
        small = np.zeros(2, np.float32)
        out = np.zeros(2, np.float32)
        for j, k in enumerate(order):
            buf = bufs[k] = np.full(1024, float(r + k + rnd), np.float32)  # 4096 B: the whole credit
            reqs.append(team.allreduce(buf, tag=("grad", k), priority=k))
            small[:] = r + j
            got = team.allreduce(small, out).wait()  # untagged, on the segment, between them
            assert (got == sum(q + j for q in range(n))).all(), (rnd, j, got)
        pycoll.wait_all(reqs)
        for k, buf in bufs.items():
            assert (buf == sum(q + k + rnd for q in range(n))).all(), (rnd, k, buf[:2])
    assert team.ctx.stats["credit_waits"] > 0  # the credit did hold some back


def times_out(post, within: str) -> None:
    """``post()`` starts a segment collective rank 1 never calls: its wait fails with
    TimeoutError naming the shm wait, well before 10 s."""
    t0 = time.monotonic()
    req = post()  # started at once (short path or express lane), then it waits
    try:
        req.wait()
    except pycoll.TimeoutError as exc:
        took = time.monotonic() - t0
        assert took < 10, took
        text = str(exc)
        if SEGMENT:
            assert f"did not finish within {within}" in text and "shm" in text, text
            # who it waits for, and what that rank did last on the segment
            assert "rank 1 has not entered it (its last: #" in text, text
            assert "allreduce 2 x float32 sum" in text, text
        else:  # (what it waits for over MPI, and that the rank is alive but not in pycoll)
            assert f"did not finish within {within}" in text and "exchange of 8 B from rank 1" in text, text
        print(f"timed out after {took:.2f} s: {exc}", flush=True)
    else:
        raise AssertionError("the collective whose peer never called did not time out")


def timeout(team: Team) -> None:
    x = np.ones(2, np.float32)
    team.allreduce(x).wait()
    assert team.planner.selected("allreduce", 8) == "shm"
    if team.rank == 0:
        times_out(lambda: team.allreduce(x, timeout=0.5), "0.5 s")
    MPI.COMM_WORLD.Barrier()  # rank 1 waits here, never calling the allreduce


def repeated(team: Team) -> None:
    n, r = team.size, team.rank
    total = n * (n + 1) // 2
    x = np.zeros(2, np.float32)
    y = np.zeros(2, np.float32)
    posted = team.ctx.posted
    reqs = []
    for i in range(200):
        x[:] = (r + 1) * i
        req = team.allreduce(x, y, priority=i % 3)
        assert req.wait() is y and (y == total * i).all(), (i, y)
        reqs.append(req)
    assert team.ctx.posted == posted + 200  # each call is a task the engine started
    entry = team.planner.recent[("allreduce", id(x))]
    task = entry.persistent.task if entry.persistent is not None else None
    if SEGMENT:
        assert task is not None and "shm" in task.name, task
    else:  # (a step task over MPI, run again by its express_run)
        assert task is not None and "shm" not in task.name and type(entry.lane).__name__ == "ProgramLane", \
            (task, entry.lane)
    assert all(q.task is entry.persistent.task for q in reqs[-50:])  # one task, started again and again
    lane = entry.lane  # run in the engine's express lane: the requests of runs done at once are one
    assert lane is not None and lane is entry.persistent.lane and entry.persistent.request is reqs[-1]
    # two repeats at once: the second runs the lane again if the first finished there (the same
    # finished request), else it is posted as a new call
    x[:] = r + 1
    first, second = team.allreduce(x, y), team.allreduce(x, y)
    assert first.wait() is y and second.wait() is y and (y == total).all()
    # a dtype reassigned in place: checked again, reduced as the new type
    z = np.full(2, 0.5, np.float32)
    for _ in range(5):
        z[:] = 0.5
        team.allreduce(z).wait()
        assert (z == 0.5 * n).all()
    z.dtype = np.int32
    z[:] = r + 1
    team.allreduce(z).wait()
    assert (z == total).all(), z
    # alternating buffers, and roots
    a, b = np.zeros(3), np.zeros(3)
    for i in range(20):
        buf = a if i % 2 else b
        root = i % n
        buf[:] = i if r == root else -1
        team.bcast(buf, root).wait()
        assert (buf == i).all(), (i, buf)
        team.barrier().wait()
    # rank 0 repeats, rank 1 posts new buffers: different paths, the same sequence of collectives
    for i in range(50):
        src = x if r == 0 else np.zeros(2, np.float32)
        dst = y if r == 0 else np.zeros(2, np.float32)
        src[:] = i
        team.allreduce(src, dst).wait()
        assert (dst == n * i).all()
    big = np.full(1 << 16, r + 1.0)
    team.allreduce(big, algorithm="ring").wait()  # point to point: keyed by sequence number
    assert (big == total).all()
    comm = Comm(MPI.COMM_WORLD)
    for i in range(100):
        x[:] = r * i
        comm.Allreduce(x, y)
        assert (y == sum(q * i for q in range(n))).all()
        comm.Iallreduce(MPI.IN_PLACE, x, MPI.MAX).Wait()
        assert (x == (n - 1) * i).all()
        y[:] = i if r == 0 else -1
        comm.Bcast(y, root=0)
        assert (y == i).all()
    assert comm.recent[("Allreduce", id(x))].lane is not None  # mpi4py's calls take the lane too
    assert comm.recent[("Iallreduce", id(MPI.IN_PLACE))].persistent is not None
    # two output arrays by turns: both calls repeat (the second is the first entry's other)
    z = np.zeros_like(y)
    for i in range(20):
        out = y if i % 2 else z
        x[:] = r + i
        comm.Allreduce(x, out)
        assert (out == n * i + n * (n - 1) / 2).all(), i
    head = comm.recent[("Allreduce", id(x))]
    assert {id(head.args[1]), id(head.other.args[1])} == {id(y), id(z)}, (head.args, head.other.args)
    assert head.lane is not None and head.other.lane is not None
    comm.team.close()


def repeat_timeout(team: Team) -> None:
    x = np.ones(2, np.float32)
    y = np.ones(2, np.float32)
    for _ in range(20):
        team.allreduce(x, y).wait()
    assert team.planner.recent[("allreduce", id(x))].persistent is not None
    if team.rank == 0:
        times_out(lambda: team.allreduce(x, y), "1 s")  # a repeat: the engine's express lane
    MPI.COMM_WORLD.Barrier()  # rank 1 waits here, never calling the allreduce


def lane_mismatch(team: Team) -> None:
    r = team.rank
    x = np.ones(2, np.float32)
    y = np.zeros(2, np.float32)
    for i in range(49):
        team.allreduce(x, y).wait()
        assert (y == team.size).all(), (i, y)
    assert team.planner.recent[("allreduce", id(x))].lane is not None
    lane_runs = team.ctx.posted
    try:
        team.allreduce(x, y, op=pycoll.ReduceOp.MAX if r == 1 else pycoll.ReduceOp.SUM).wait(timeout=30)
    except pycoll.MismatchError as exc:
        print(f"lane mismatch on rank {r}: {exc}", flush=True)
        assert "sum" in str(exc).lower() and "max" in str(exc).lower(), exc
    else:
        raise AssertionError(f"rank {r}: an allreduce whose op differs returned {y}")
    assert team.ctx.posted > lane_runs
    try:
        team.allreduce(x, y).wait(timeout=30)  # (the lane's repeat: refused as any call)
    except pycoll.MismatchError:
        pass
    else:
        raise AssertionError(f"rank {r}: a call after the mismatch returned")


def owed_timeout(team: Team) -> None:
    n, r = team.size, team.rank
    assert n == 3
    x = np.full(100, float(r), np.float32)
    out = np.empty(300, np.float32) if r == 0 else None
    while team.shared.signed < 10:  # (the next: collective 11, past the first 8, no power of two)
        team.gather(x, out, root=0).wait()
    MPI.COMM_WORLD.Barrier()
    if r == 0:
        MPI.COMM_WORLD.Barrier()  # never calls that gather: waits here for the others
        return
    team.gather(x, None, root=0).wait()  # (returns: goes on without the root, owing the check)
    y = np.full(1000, float(r), np.float32)
    if r == 1:
        t0 = time.monotonic()
        try:
            team.bcast(y, root=2, timeout=2.0).wait()  # (time for rank 2 to get there first)
        except pycoll.TimeoutError as exc:
            text = str(exc)
            assert time.monotonic() - t0 < 10 and "did not finish within 2 s" in text, text
            assert "but for the check of an earlier gather" in text and \
                "rank 0, the root, has not entered that gather (its last: #10, gather 100 x float32 root 0)" \
                in text, text
            assert (y == 2).all(), y  # (it has the data: only the check is owed)
            print(f"timed out waiting for the owed check: {exc}", flush=True)
        else:
            raise AssertionError("the bcast returned while its rank owed a check")
    else:  # (the root checks every rank's call: it waits for rank 0's signature, or learns of rank 1)
        try:
            team.bcast(y, root=2, timeout=2.0).wait()
        except (pycoll.TimeoutError, pycoll.PeerLostError) as exc:
            # (a wait of its own for rank 0's call of this bcast: no earlier gather's check named)
            assert "but for the check" not in str(exc), exc
            print(f"rank 2: {exc}", flush=True)
        else:
            raise AssertionError("the bcast's root returned without rank 0's call")
    MPI.COMM_WORLD.Barrier()


def main(mode: str) -> None:
    ctx = pycoll.Context(credit_bytes=4096 if mode == "mixed" else 0, partition_bytes=0,
                         timeout=1.0 if mode == "repeat-timeout" else 60)
    team = Team.from_mpi(MPI.COMM_WORLD, ctx)
    assert (team.shared is not None) == SEGMENT, "the ranks share a host: the team has a segment"
    {"persistent": persistent, "mixed": mixed, "timeout": timeout, "repeated": repeated,
     "repeat-timeout": repeat_timeout, "owed-timeout": owed_timeout,
     "lane-mismatch": lane_mismatch}[mode](team)
    team.close()


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
