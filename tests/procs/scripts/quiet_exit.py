"""Run under mpiexec by tests/procs/test_liveness.py, on MPI's or UCX's point to point (PYCOLL_TLS
mpi or ucx: no shared segment): the last rank leaves in the way argv 1 names, and every other rank
prints ``RANK <r> LOST <its error's rank> <seconds> <type>: <text>`` (or ``RANK <r> NO ERROR``).

* ``os_exit``: it posts a 1 MiB ring allreduce (whose later steps need the others' data) and ends
  with ``os._exit(3)`` (mid-collective);
* ``sys_exit``: ``sys.exit(0)`` between calls (its process lives on in MPI_Finalize);
* ``raise``: an uncaught exception between calls (PYCOLL_ABORT_ON_ERROR=0: it lives on too);
* ``sigkill``: it posts a 1 MiB bcast of a tag from itself and is killed (SIGKILL) before the
  others post theirs: they then take its data from its memory (MPICH and UCX read a large
  message from the sender's process, which is gone);
* ``stop``: rank 0 stops it (SIGSTOP) for argv 2 seconds while every rank waits in an allreduce,
  then lets it go on (SIGCONT): nobody is lost, every rank prints ``RANK <r> OK`` with the right
  sum.

A rank that leaves prints ``RANK <r> LEAVES`` first. The launcher must let the others live on once
a rank is gone (the test starts each rank under a shell, which the rank leaves for a process
group of its own: hydra ends the job it launched when a rank dies).
"""

import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team


def main(way: str, seconds: float) -> None:
    os.setpgid(0, 0)  # (see the docstring: the launcher's cleanup must not end the survivors)
    world = MPI.COMM_WORLD
    pids = world.allgather(os.getpid())
    team = Team.from_mpi(world)
    assert team.shared is None and team.transport.name in ("mpi", "ucx"), team
    last = team.size - 1
    x = np.ones(1000)
    for _ in range(3):
        team.allreduce(x.copy()).wait()
    world.Barrier()
    if way == "stop":
        return stop(team, pids, seconds)
    big = np.zeros(1 << 17)  # 1 MiB
    if team.rank == last:
        print(f"RANK {team.rank} LEAVES", flush=True)
        if way == "os_exit":
            team.allreduce(big, algorithm="ring").test()
            os._exit(3)
        if way == "sys_exit":
            sys.exit(0)
        if way == "raise":
            raise RuntimeError(f"rank {team.rank} gives up")
        if way == "sigkill":
            req = team.bcast(np.ones_like(big), root=last, tag="big")
            t = time.monotonic()
            while time.monotonic() - t < 0.3:  # (its sends go out)
                req.test()
            os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError(way)
    if way == "sigkill":
        time.sleep(0.6)  # (until it is gone)
    t0 = time.monotonic()
    try:
        if way == "sigkill":
            team.bcast(big, root=last, tag="big", timeout=30).wait()
        elif way == "os_exit":
            team.allreduce(big, algorithm="ring", timeout=30).wait()
        else:
            team.allreduce(x.copy(), timeout=30).wait()
        print(f"RANK {team.rank} NO ERROR", flush=True)
    except pycoll.PycollError as exc:
        took = time.monotonic() - t0
        print(f"RANK {team.rank} LOST {getattr(exc, 'rank', None)} {took:.3f} {type(exc).__name__}: {exc}",
              flush=True)
    # (no exit: a survivor that ended now would be lost to those still waiting; the test ends the job)
    time.sleep(120)
    os._exit(0)


def stop(team: Team, pids: list, seconds: float) -> None:
    n, last = team.size, team.size - 1
    x = np.full(1000, team.rank + 1.0)
    if team.rank == 0:
        os.kill(pids[last], signal.SIGSTOP)
        resume = threading.Timer(seconds, os.kill, (pids[last], signal.SIGCONT))
        resume.start()
    t0 = time.monotonic()
    try:
        team.allreduce(x, timeout=30).wait()
    except pycoll.PycollError as exc:
        print(f"RANK {team.rank} LOST {getattr(exc, 'rank', None)} {time.monotonic() - t0:.3f} "
              f"{type(exc).__name__}: {exc}", flush=True)
        os._exit(1)
    took = time.monotonic() - t0
    assert (x == n * (n + 1) / 2).all(), x[:4]
    if team.rank == 0:
        resume.join()
        assert took >= seconds * 0.9, f"rank 0 finished in {took:.2f} s while rank {last} was stopped"
    team.close()
    print(f"RANK {team.rank} OK after {took:.2f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.5)
