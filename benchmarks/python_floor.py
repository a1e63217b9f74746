"""How much of a repeated small call is Python: ``team.bcast(x, 0).wait()`` (and scatter) next to
the native call alone (``ShmSegment.run`` on the collective's native state) and MPI's own call.

    mpiexec -n 2 python benchmarks/python_floor.py [--iters 20000]

Rank 0 prints µs per call (best of 2 rounds each, 300 calls of warm-up): what the engine's express
lane costs over the native call is the difference between the first two columns.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll.persistent import repeat_key


def per_call(fn, iters: int, comm) -> float:
    best = float("inf")
    for _ in range(2):
        for _ in range(300):
            fn()
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        comm.Barrier()
        best = min(best, (time.perf_counter() - t) / iters * 1e6)
    return best


def measure(team, comm, coll: str, nbytes: int, iters: int) -> tuple:
    """(pycoll, native alone, MPI) µs per call of one collective."""
    if coll == "bcast":
        x = np.ones(nbytes // 4, np.float32)
        first = x

        def ours():
            team.bcast(x, root=0).wait()

        def theirs():
            comm.Bcast(x, root=0)
    else:
        x = np.ones(nbytes // 4 // comm.size, np.float32)
        whole = np.ones(x.size * comm.size, np.float32) if comm.rank == 0 else None
        first = whole

        def ours():
            team.scatter(whole, x, root=0).wait()

        def theirs():
            comm.Scatter(whole, x, root=0)
    t_ours = per_call(ours, iters, comm)
    task = team.recent[repeat_key(coll, (first,))].persistent.task  # remembered by its first buffer
    seg, state = task.seg, task.native

    def native():
        if not seg.run(state):  # the peer was not there within the polls: finish it as the engine would
            since = time.monotonic()
            while not seg.progress(state, since):
                pass

    return t_ours, per_call(native, iters, comm), per_call(theirs, iters, comm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20000)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    team = pycoll.Team.from_mpi(comm)
    if team.shared is None:
        raise SystemExit("python_floor: the ranks share no segment (run them on one host)")
    if comm.rank == 0:
        print(f"# µs per call, {comm.size} ranks")
        print(f"{'call':<10} {'bytes':>6} {'pycoll':>8} {'native':>8} {'MPI':>8}")
    for coll, nbytes in (("bcast", 8), ("bcast", 4096), ("scatter", 8), ("scatter", 4096)):
        t_ours, t_native, t_mpi = measure(team, comm, coll, nbytes, args.iters)
        if comm.rank == 0:
            print(f"{coll:<10} {nbytes:>6} {t_ours:>8.2f} {t_native:>8.2f} {t_mpi:>8.2f}", flush=True)
    team.close()


if __name__ == "__main__":
    main()
