"""Small hierarchical collectives called in a loop: what a call of rab or split_rail costs once its
schedule is kept and rebound, next to the flat rd and MPI's own allreduce in the same run.

Run under mpiexec with pretend nodes, e.g. 4 ranks as 2 nodes of 2, UCX between the nodes::

    PYCOLL_RANKS_PER_NODE=2 PYCOLL_TLS=ucx,shm mpiexec -n 4 python benchmarks/hier_calls.py \
        [--algorithms rab,split_rail,rd] [--bytes 8] [--iters 2000] [--no-pin]

Each pretend node's ranks are pinned to its own share of the cores (one core each for 2 nodes on a
2-core machine), as a real node's ranks share no core with another node's; ``--no-pin`` leaves
them to the scheduler. Prints the slowest rank's mean time per call in microseconds.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

from pycoll import Team
from pycoll.topology import node_key


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", default="rab,split_rail,rd")
    p.add_argument("--bytes", type=int, default=8)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--no-pin", action="store_true")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    if not a.no_pin:  # (before the team is made: it sees how many cores its node's ranks share)
        keys = comm.allgather(node_key(comm.Get_rank()))
        nodes = list(dict.fromkeys(keys))
        node = nodes.index(keys[comm.Get_rank()])
        cores = sorted(os.sched_getaffinity(0))
        share = max(1, len(cores) // len(nodes))
        os.sched_setaffinity(0, cores[node * share:(node + 1) * share] or cores[-share:])
    team = Team.from_mpi(comm)
    topo = team.topology
    x = np.ones(max(1, a.bytes // 4), np.float32)
    y = np.empty_like(x)

    def timed(run: object) -> float:
        for _ in range(max(10, a.iters // 10)):
            run()
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            run()
        return comm.allreduce((time.perf_counter() - t0) / a.iters * 1e6, op=MPI.MAX)

    rows = []
    for alg in a.algorithms.split(","):
        rows.append((alg, timed(lambda alg=alg: team.allreduce(x, y, algorithm=alg).wait())))
        assert (y == team.size).all(), (alg, y[:4])
    rows.append(("MPI", timed(lambda: comm.Allreduce(x, y))))
    if team.rank == 0:
        nodes = "x".join(str(n) for n in topo.ppn) if topo is not None else "1"
        print(f"# allreduce {a.bytes} B in a loop on the same arrays: {team.size} ranks, nodes {nodes}, "
              f"{'unpinned' if a.no_pin else 'each node on its own cores'}; us per call, slowest rank")
        for alg, us in rows:
            print(f"{alg:>12} {us:10.2f}")
    team.close()


if __name__ == "__main__":
    main()
