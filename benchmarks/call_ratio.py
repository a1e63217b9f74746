"""A small call's time as a ratio to MPI's own, block by block: what holds still on a busy machine.

Each rank alternates blocks of ``--calls`` repeated calls of pycoll's collective (the team's
method, the same arrays every time: the express lane) and of MPI's (``comm.Allreduce``,
``comm.Bcast``) on ``--bytes`` bytes, ``--blocks`` times, and prints per collective the median
pycoll time and the median of the per-block ratios pycoll/MPI. The ``new`` rows call pycoll on
the next of 256 pairs of arrays each time (a new call: the planner's post, a pooled task rebound),
as ``benchmarks/call_cost.py``'s ``new`` rows. A machine whose speed drifts moves
both sides of a block alike: run it once per tree, alternating, to compare two versions of
pycoll (``PYTHONPATH=<tree>``), under ``PYCOLL_TLS=mpi`` for MPI's point to point::

    PYCOLL_TLS=mpi mpiexec -n 2 python benchmarks/call_ratio.py [--bytes 8] [--blocks 25] [--calls 1000]
        [--colls allreduce,bcast,allreduce-new,bcast-new]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import numpy as np
from mpi4py import MPI

from pycoll import Team


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=25)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--colls", default="allreduce,bcast,allreduce-new,bcast-new")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    team = Team.from_mpi(world)
    x = np.ones(max(1, args.bytes // 4), np.float32)
    y = np.empty_like(x)
    xs = [np.ones_like(x) for _ in range(256)]
    ys = [np.empty_like(x) for _ in range(256)]
    turn = itertools.cycle(range(256))

    def allreduce_new() -> None:
        i = next(turn)
        team.allreduce(xs[i], ys[i]).wait()

    def bcast_new() -> None:
        team.bcast(ys[next(turn)], root=0).wait()

    pairs = {
        "allreduce": (lambda: team.allreduce(x, y).wait(), lambda: world.Allreduce(x, y)),
        "bcast": (lambda: team.bcast(y, root=0).wait(), lambda: world.Bcast(y, root=0)),
        "allreduce-new": (allreduce_new, lambda: world.Allreduce(x, y)),
        "bcast-new": (bcast_new, lambda: world.Bcast(y, root=0)),
    }
    for coll in args.colls.split(","):
        ours, theirs = pairs[coll]
        for call in (ours, theirs):
            for _ in range(500):
                call()
        times, ratios = [], []
        for _ in range(args.blocks):
            block = []
            for call in (ours, theirs):
                world.Barrier()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    call()
                block.append((time.perf_counter() - t0) / args.calls * 1e6)
            times.append(block[0])
            ratios.append(block[0] / block[1])
        if world.rank == 0:
            ratio = statistics.median(ratios)
            print(f"{coll:14} pycoll {statistics.median(times):7.2f} us  pycoll/MPI {ratio:6.3f}"
                  f"  (ratios {min(ratios):.3f}-{max(ratios):.3f})", flush=True)
    team.close()


if __name__ == "__main__":
    main()
