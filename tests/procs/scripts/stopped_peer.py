"""Run under mpiexec by tests/procs/test_shm.py: rank 0 stops the last rank (SIGSTOP) and lets it
go on (SIGCONT) after ``seconds`` from a thread, while every rank calls an allreduce on the shared
segment (PYCOLL_TIMEOUT well above ``seconds``). A stopped rank is alive, not lost: every rank
gets the right sum, none raises PeerLostError, and the call took about ``seconds``."""

import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from pycoll import Team
from tests.rank import run_rank


def main(seconds: str) -> None:
    world = MPI.COMM_WORLD
    pids = world.allgather(os.getpid())
    team = Team.from_mpi(world)
    assert team.shared is not None, "this check is for the shared segment"
    n, last = team.size, team.size - 1
    x = np.full(1000, team.rank + 1.0)
    team.allreduce(x).wait()  # the segment works before
    x[:] = team.rank + 1.0
    world.Barrier()
    if team.rank == 0:
        os.kill(pids[last], signal.SIGSTOP)
        resume = threading.Timer(float(seconds), os.kill, (pids[last], signal.SIGCONT))
        resume.start()
    t0 = time.monotonic()
    team.allreduce(x, timeout=30).wait()
    took = time.monotonic() - t0
    assert (x == n * (n + 1) / 2).all(), x[:4]
    if team.rank == 0:
        resume.join()
        assert took >= float(seconds) * 0.9, f"rank 0 finished in {took:.2f} s while rank {last} was stopped"
    print(f"RANK {team.rank} OK after {took:.2f} s", flush=True)
    team.close()


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
