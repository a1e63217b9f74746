"""Run under mpiexec by tests/test_matrix.py: the whole collective matrix (tests/matrix.py) on a
team of real processes, every registered algorithm (shm ones too when the ranks share a host)."""

import sys
import time

from mpi4py import MPI

from pycoll.team import Team
from tests.matrix import run_all
from tests.mpi.common import run_rank


def main(dtypes: str, large: str) -> None:
    team = Team.from_mpi(MPI.COMM_WORLD)
    t0 = time.monotonic()
    seg = team.shared
    done = run_all([team], team.size, seg is not None, int(large), dtypes=dtypes == "1",
                   cma=seg is not None and seg.cma)
    if team.rank == 0:
        print(f"{team.size} ranks: {sum(done.values())} cases in {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    run_rank(main, *sys.argv[1:])
