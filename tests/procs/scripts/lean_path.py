"""The short path of small collectives on a shared segment (2+ ranks on one host), one check per
mode (argv[1]):

* ``persistent``: persistent allreduce and bcast started many times, buffers refilled between
  starts; ``team.allreduce``/``team.bcast`` and ``pycoll.mpi.Comm.Allreduce`` on the same arrays;
* ``mixed``: tagged allreduces posted in a different order on each rank under a credit of one of
  them, with untagged segment collectives (the short path) posted in between, all correct;
* ``timeout``: a segment collective whose peer never calls fails with TimeoutError naming what it
  waited on, within its timeout, on the rank that called it (no hang).
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll.mpi import Comm
from pycoll.team import Team
from tests.rank import run_rank


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


def timeout(team: Team) -> None:
    x = np.ones(2, np.float32)
    team.allreduce(x).wait()
    assert team.planner.selected("allreduce", 8) == "shm"
    if team.rank == 0:
        t0 = time.monotonic()
        req = team.allreduce(x, timeout=0.5)  # rank 1 never calls: started at once, then waits
        try:
            req.wait()
        except pycoll.TimeoutError as exc:
            took = time.monotonic() - t0
            assert took < 10, took
            assert "did not finish within 0.5 s" in str(exc) and "shm" in str(exc), str(exc)
            print(f"timed out after {took:.2f} s: {exc}", flush=True)
        else:
            raise AssertionError("the allreduce whose peer never called did not time out")
    MPI.COMM_WORLD.Barrier()  # rank 1 waits here, never calling the allreduce


def main(mode: str) -> None:
    ctx = pycoll.Context(credit_bytes=4096 if mode == "mixed" else 0, partition_bytes=0, timeout=60)
    team = Team.from_mpi(MPI.COMM_WORLD, ctx)
    assert team.shared is not None, "the ranks share a host: the team has a segment"
    {"persistent": persistent, "mixed": mixed, "timeout": timeout}[mode](team)
    team.close()


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
