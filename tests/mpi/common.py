"""What every script run under mpiexec by the tests shares."""

import sys
import traceback

from mpi4py import MPI


def run_rank(main, *args) -> None:
    """Run ``main(*args)`` on this rank; print ``RANK r OK`` (the test runner looks for it) or the
    traceback, and abort the whole job on failure so no rank waits for a dead one."""
    try:
        main(*args)
    except Exception:
        print(f"RANK {MPI.COMM_WORLD.rank} FAILED\n{traceback.format_exc()}", flush=True)
        MPI.COMM_WORLD.Abort(1)
    print(f"RANK {MPI.COMM_WORLD.rank} OK", flush=True)
    sys.stdout.flush()
