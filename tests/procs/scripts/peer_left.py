"""Run under mpiexec by tests/procs/test_shm.py: the last rank leaves without calling the
collective the others wait in (``return``: returns from main, its process living on in
MPI_Finalize; ``raise``: an uncaught exception; ``close``: closes its team and sleeps), on the
shared segment, through the Team API and a repeated call (the express lane) or ``pycoll.mpi.Comm``.
Every other rank prints how long it took to raise ``pycoll.PeerLostError`` and its text."""

import sys
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team
from pycoll.mpi import Comm


def main(mode: str, via: str) -> None:
    team = Team.from_mpi(MPI.COMM_WORLD)
    comm = Comm(MPI.COMM_WORLD) if via == "comm" else None
    x, y = np.ones(1000, np.float32), np.zeros(1000, np.float32)

    def call() -> None:
        if comm is not None:
            comm.Allreduce(x, y)
        else:
            team.allreduce(x, y, timeout=20).wait()

    for _ in range(5):  # the same call, repeated: later ones take the express lane
        call()
    assert (y == team.size).all()
    MPI.COMM_WORLD.Barrier()
    if team.rank == team.size - 1:
        if mode == "raise":
            raise ValueError(f"boom in rank {team.rank}")
        if mode == "close":
            (comm.team if comm is not None else team).close()
            time.sleep(3)
        return
    t0 = time.monotonic()
    try:
        call()
        print(f"RANK {team.rank} NO ERROR", flush=True)
    except pycoll.PeerLostError as exc:
        if comm is not None:  # as mpi4py users catch it: ULFM's class
            assert isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_PROC_FAILED, repr(exc)
        print(f"RANK {team.rank} LOST after {time.monotonic() - t0:.3f} s: {exc}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
