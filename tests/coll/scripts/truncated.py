"""Run under mpiexec by tests/coll/test_mpi.py: with the agreement check off (``PYCOLL_CHECK=off``),
ranks whose allreduce sizes differ on the MPI transport:
the rank that receives the larger message raises a TransportError that says the calls differ in
size and how to have every call checked (not MPI's bare "see the MPI_ERROR field")."""

import numpy as np
from mpi4py import MPI

import pycoll
from tests.rank import run_rank


def main():
    team = pycoll.Team.from_mpi(MPI.COMM_WORLD)
    r = team.rank
    buf = np.ones(10 if r == 0 else 12)
    try:
        team.allreduce(buf, algorithm="rd", timeout=5).wait()
    except pycoll.TransportError as exc:
        assert r == 0, f"rank {r}: {exc}"
        assert "differ in size" in str(exc) and "PYCOLL_CHECK=on" in str(exc), str(exc)
    else:
        assert r == 1, "rank 0 received 96 B into 80 B without an error"
    team.close()


if __name__ == "__main__":
    run_rank(main)
