"""The rank side of every script the launchers in tests/launch.py start: run ``main``, then print
``RANK <r> OK`` (the launcher looks for it) or ``RANK <r> FAILED`` with the traceback, and stop the
whole job at once so that no rank waits for a dead one."""

import os
import sys
import traceback


def run_rank(main, *args) -> None:
    """Run ``main(*args)`` on this MPI rank; on failure print the traceback and abort COMM_WORLD."""
    from mpi4py import MPI

    try:
        main(*args)
    except Exception:
        print(f"RANK {MPI.COMM_WORLD.rank} FAILED\n{traceback.format_exc()}", flush=True)
        MPI.COMM_WORLD.Abort(1)
        os._exit(1)  # MPICH's Abort may return before the job is torn down: never print OK
    print(f"RANK {MPI.COMM_WORLD.rank} OK", flush=True)
    sys.stdout.flush()


def run_torch_rank(main, *args) -> None:
    """Run ``main(*args)`` on this torch rank (RANK, or PMI_RANK under mpiexec); on failure print the
    traceback and exit non-zero at once (``os._exit``: no rank waits in atexit for a dead peer)."""
    rank = os.environ.get("RANK") or os.environ.get("PMI_RANK") or "?"
    try:
        main(*args)
    except BaseException:
        print(f"RANK {rank} FAILED\n{traceback.format_exc()}", flush=True)
        sys.stdout.flush()
        os._exit(1)
    print(f"RANK {rank} OK", flush=True)
