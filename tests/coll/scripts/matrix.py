"""Run under mpiexec by tests/coll/test_matrix.py: the whole collective matrix (tests/reference.py) on a
team of real processes, every registered algorithm (shm ones too when the ranks share a host)."""

import sys
import time

from mpi4py import MPI

from pycoll.team import Team
from tests.rank import run_rank
from tests.reference import run_matrix


def main(dtypes: str, large: str, thin: str = "0") -> None:
    team = Team.from_mpi(MPI.COMM_WORLD)
    t0 = time.monotonic()
    seg = team.shared
    done = run_matrix([team], team.size, seg is not None, int(large), dtypes=dtypes == "1",
                      thin=int(thin), cma=seg is not None and seg.cma)
    if team.rank == 0:
        print(f"{team.size} ranks: {sum(done.values())} cases in {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    run_rank(main, *sys.argv[1:])
