"""How close allreduce gets to the node's memory bandwidth, measured in the same run.

Every rank first copies a private buffer at the same time as the others (a STREAM-style copy:
``np.copyto``, read + write counted), which gives the bandwidth one rank gets while all ranks
copy. An allreduce of M bytes must at least read each rank's input and write its result: 2 M
bytes per rank, all ranks at once; that at the per-rank bandwidth is the bound. (The
shared-memory algorithm moves (5 - 1/n) M bytes per rank in all: its input but its share into
its slot, its share reduced over the n inputs, the result copied out; what passes through the
segment's slots, a chunk at a time, can stay in cache.) On arrays made by ``team.alloc``, which
every rank maps, pycoll's allreduce reduces straight out of the ranks' inputs into their outputs:
M bytes read and M written per rank, the bound's own traffic. pycoll's allreduce (on the caller's
arrays and on ``team.alloc`` ones) and MPI's are timed side by side at each size and shown against
the bound (bound/time: 1 is the bound, the target is within 1.5x of it, 0.67).

    mpiexec -n 16 python benchmarks/copy_bound.py [--sizes 16M,64M,128M] [--iters 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll.config import parse_bytes


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
        print(f"{'bytes':>12} {'bound ms':>9} {'pycoll ms':>10} {'bound/pycoll':>13} {'alloc ms':>9} "
              f"{'bound/alloc':>12} {'MPI ms':>8} {'bound/MPI':>10} {'MPI/alloc':>10}")
    for nbytes in (parse_bytes(s) for s in args.sizes.split(",")):
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        a, b = team.alloc(x.size), team.alloc(x.size)  # every rank maps them
        a[:] = 1
        t_ours = timed(comm, lambda: team.allreduce(x, y).wait(), args.iters)  # noqa: B023
        t_alloc = timed(comm, lambda: team.allreduce(a, b).wait(), args.iters)  # noqa: B023
        t_mpi = timed(comm, lambda: comm.Allreduce(x, y), args.iters)  # noqa: B023
        bound = 2 * nbytes / bw
        if rank == 0:
            print(f"{nbytes:>12} {bound * 1e3:>9.2f} {t_ours * 1e3:>10.2f} {bound / t_ours:>13.2f} "
                  f"{t_alloc * 1e3:>9.2f} {bound / t_alloc:>12.2f} {t_mpi * 1e3:>8.2f} "
                  f"{bound / t_mpi:>10.2f} "
                  f"{t_mpi / t_alloc:>10.2f}", flush=True)
    team.close()


if __name__ == "__main__":
    main()
