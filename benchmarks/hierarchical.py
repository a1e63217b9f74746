"""Hierarchical collectives against flat ones and MPI, on ranks that pretend to be nodes.

Run under mpiexec with a node grouping, e.g. 8 ranks as 2 nodes with the level between nodes on
UCX over TCP (the node level on each node's shared segment)::

    PYCOLL_RANKS_PER_NODE=4 PYCOLL_TLS=ucx,shm UCX_TLS=tcp \\
        mpiexec -n 8 python benchmarks/hierarchical.py [--colls allreduce,bcast,barrier]
        [--sizes 8,64K,1M,16M] [--budget 0.3] [--repeat 3]

For each size it prints microseconds per call of every variant (the slowest rank's mean over a
loop of about ``--budget`` seconds, best of ``--repeat`` rounds, variants taking turns so that they
see the same load) and each one's time relative to the flat algorithm (``flat/x``: above 1 is
faster than flat). allreduce: rab, split_rail, flat ring (and rd below 256 KiB) on the whole team,
MPI_Allreduce; bcast: hier, flat knomial, MPI_Bcast; barrier: hier, dissemination, MPI_Barrier.
Each result is checked against numpy first. With UCX_TLS=tcp, MPICH (which runs on UCX) uses TCP
between its ranks too.
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI
from p2p_algorithms import timed  # the same interleaved timing (this folder is on sys.path)

from pycoll import Team
from pycoll.config import parse_bytes


def variants(team: Team, comm: MPI.Comm, coll: str, nbytes: int):
    """({name: fn}, check(name), flat name) of one size."""
    r = comm.rank
    count = max(1, nbytes // 4)
    if coll == "allreduce":
        src = (np.arange(count) % 13 + r).astype(np.float32)
        dst = np.empty_like(src)
        flat = "ring" if nbytes >= 256 << 10 else "rd"
        fns = {a: (lambda a=a: team.allreduce(src, dst, algorithm=a).wait())
               for a in ("rab", "split_rail", flat)}
        fns["MPI"] = lambda: comm.Allreduce(src, dst, op=MPI.SUM)
        want = sum((np.arange(count) % 13 + k).astype(np.float32) for k in range(comm.size))

        def check(name: str) -> None:
            dst[...] = -1
            fns[name]()
            assert np.array_equal(dst, want), f"allreduce {name} {nbytes} B wrong on rank {r}"
    elif coll == "bcast":
        buf = np.empty(count, np.float32)
        flat = "knomial"
        fns = {a: (lambda a=a: team.bcast(buf, 0, algorithm=a).wait()) for a in ("hier", flat)}
        fns["MPI"] = lambda: comm.Bcast(buf, root=0)

        def check(name: str) -> None:
            buf[...] = np.arange(count) if r == 0 else -1
            fns[name]()
            assert np.array_equal(buf, np.arange(count, dtype=np.float32)), f"bcast {name} wrong on rank {r}"
    else:
        flat = "dissemination"
        fns = {a: (lambda a=a: team.barrier(algorithm=a).wait()) for a in ("hier", flat)}
        fns["MPI"] = comm.Barrier

        def check(name: str) -> None:
            fns[name]()
    return fns, check, flat


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--colls", default="allreduce,bcast,barrier")
    p.add_argument("--sizes", default="8,64K,1M,16M")
    p.add_argument("--budget", type=float, default=0.3)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    team = Team.from_mpi(comm)
    if comm.rank == 0:
        lead, node = team.leaders_team(), team.node_team()
        level = "shared segment" if node.shared is not None else node.transport.name
        print(f"{comm.size} ranks, {team.topology}; between nodes: {team.transport.name}"
              f" (leaders: {lead.transport.name if lead else '-'}), node level: {level}", flush=True)
    for coll in args.colls.split(","):
        sizes = ["0"] if coll == "barrier" else args.sizes.split(",")
        for text in sizes:
            nbytes = parse_bytes(text)
            fns, check, flat = variants(team, comm, coll, nbytes)
            for name in fns:
                check(name)
            best = timed(comm, fns, args.budget, args.repeat)
            if comm.rank == 0:
                cells = "  ".join(f"{name} {best[name] * 1e6:9.1f} ({best[flat] / best[name]:4.2f})"
                                  for name in fns)
                print(f"{coll:<9} {nbytes:>9} B  us (flat/x): {cells}", flush=True)
    team.close()


if __name__ == "__main__":
    main()
