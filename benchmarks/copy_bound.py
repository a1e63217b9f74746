"""How close allreduce gets to the node's memory bandwidth, measured in the same run.

Every rank first copies a private buffer at the same time as the others (a STREAM-style copy:
``np.copyto``, read + write counted), which gives the bandwidth one rank gets while all ranks
copy. An allreduce of M bytes must at least read each rank's input and write its result: 2 M
bytes per rank, all ranks at once; that at the per-rank bandwidth is the bound. (The
shared-memory algorithm moves (5 - 1/n) M bytes per rank in all: its input but its share into
its slot, its share reduced over the n inputs, the result copied out; what passes through the
segment's slots, a chunk at a time, can stay in cache.) On arrays made by ``team.alloc``, which
every rank maps, pycoll's allreduce reduces straight out of the ranks' inputs into their outputs:
M bytes read and M written per rank, the bound's own traffic; the single-copy form does the same on
the caller's own arrays, reading the peers' inputs and writing their outputs with
process_vm_readv/writev. pycoll's allreduce (its selection's choice, the segment and single-copy
forms on the caller's arrays, and the mapped form on ``team.alloc`` ones) and MPI's are timed side
by side at each size and shown against the bound (bound/time: 1 is the bound, the target is within
1.5x of it, 0.67).

    mpiexec -n 16 python benchmarks/copy_bound.py [--sizes 16M,64M,128M] [--iters 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll.config import parse_bytes

#: The columns: the selection's choice, the segment and single-copy forms on the caller's arrays,
#: the mapped form on team.alloc arrays, and MPI's Allreduce.
FORMS = ("auto", "shm", "cma", "alloc", "MPI")


def copy_bandwidth(comm, nbytes: int, repeat: int) -> float:
    """Bytes per second one rank moves (read + write) while every rank copies ``nbytes``."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeat):
        comm.Barrier()
        t = time.perf_counter()
        np.copyto(dst, src)
        comm.Barrier()  # the slowest rank sets the time: they all copy at once
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best


def timed(comm, call, iters: int) -> float:
    call()
    best = float("inf")
    for _ in range(iters):
        comm.Barrier()
        t = time.perf_counter()
        call()
        best = min(best, comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16M,64M,128M", help="allreduce sizes in bytes (float32)")
    ap.add_argument("--copy-bytes", default="256M",
                    help="each rank's buffer in the copy test (STREAM: well above the caches)")
    ap.add_argument("--iters", type=int, default=5, help="calls per size (the best is kept)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n, rank = comm.size, comm.rank
    team = pycoll.Team.from_mpi(comm)
    bw = copy_bandwidth(comm, parse_bytes(args.copy_bytes), 5)
    if rank == 0:
        print(f"# {n} ranks; copy bandwidth per rank with all copying: {bw / 1e9:.2f} GB/s "
              f"(node: {n * bw / 1e9:.1f} GB/s); bound: 2 M bytes per rank at that rate")
        print("# ms: the best of the calls; b/x: bound / time (1 is the bound, 0.67 within 1.5x); "
              "auto: what the selection takes for the caller's arrays; shm, cma: those forms on them; "
              "alloc: team.alloc arrays (the mapped form)")
        print(f"{'bytes':>12} {'bound ms':>9} " + " ".join(f"{f + ' ms':>9} {'b/' + f:>8}" for f in FORMS)
              + f" {'MPI/auto':>9}")
    for nbytes in (parse_bytes(s) for s in args.sizes.split(",")):
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        a, b = team.alloc(x.size), team.alloc(x.size)  # every rank maps them
        a[:] = 1
        calls = {
            "auto": lambda: team.allreduce(x, y).wait(),  # noqa: B023
            "shm": lambda: team.allreduce(x, y, algorithm="shm").wait(),  # noqa: B023
            "cma": lambda: team.allreduce(x, y, algorithm="cma").wait(),  # noqa: B023
            "alloc": lambda: team.allreduce(a, b).wait(),  # noqa: B023
            "MPI": lambda: comm.Allreduce(x, y),  # noqa: B023
        }
        if not team.shared or not team.shared.cma:
            del calls["cma"]
        times = {form: timed(comm, call, args.iters) for form, call in calls.items()}
        bound = 2 * nbytes / bw
        if rank == 0:
            cells = [f"{times[f] * 1e3:>9.2f} {bound / times[f]:>8.2f}" if f in times
                     else f"{'-':>9} {'-':>8}" for f in FORMS]
            print(f"{nbytes:>12} {bound * 1e3:>9.2f} " + " ".join(cells)
                  + f" {times['MPI'] / times['auto']:>9.2f}", flush=True)
    team.close()


if __name__ == "__main__":
    main()
