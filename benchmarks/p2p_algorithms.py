"""Point-to-point algorithms of allgather, reduce_scatter and alltoall against each other and MPI.

Run under mpiexec over the MPI transport (no shared segment), e.g.::

    PYCOLL_TLS=mpi mpiexec -n 4 python benchmarks/p2p_algorithms.py [--colls allgather,alltoall]
        [--sizes 8,1K,64K,1M,16M] [--budget 0.3] [--repeat 3]

For each collective and whole-buffer size (the bytes the selection table is looked up with:
recvbuf of allgather, sendbuf of reduce_scatter and alltoall; float32, at least one element per
block) it prints the time per call in microseconds of every pycoll algorithm (``algorithm=``) and of
MPI's own (Allgather, Reduce_scatter_block, Alltoall): the slowest rank's mean over a loop of about
``--budget`` seconds, the best of ``--repeat`` rounds (the algorithms take turns). Each result is
checked once against numpy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

from pycoll import Team
from pycoll.config import parse_bytes

ALGS = {"allgather": ["ring", "rd", "bruck"], "reduce_scatter": ["ring", "rhalving"],
        "alltoall": ["pairwise", "bruck"]}


def case(team: Team, comm: MPI.Comm, coll: str, nbytes: int):
    """(whole-buffer bytes, {name: fn}, check) of one size."""
    n, r = comm.size, comm.rank
    per = max(1, nbytes // (4 * n))
    whole = per * n
    rng = np.random.default_rng(r)
    if coll == "allgather":
        send = rng.integers(0, 100, per).astype(np.float32)
        recv = np.empty(whole, np.float32)
        fns = {a: (lambda a=a: team.allgather(send, recv, algorithm=a).wait()) for a in ALGS[coll]}
        fns["MPI"] = lambda: comm.Allgather(send, recv)

        def want() -> np.ndarray:
            return np.concatenate(comm.allgather(send))
    elif coll == "reduce_scatter":
        send = rng.integers(-5, 5, whole).astype(np.float32)
        recv = np.empty(per, np.float32)
        fns = {a: (lambda a=a: team.reduce_scatter(send, recv, algorithm=a).wait()) for a in ALGS[coll]}
        fns["MPI"] = lambda: comm.Reduce_scatter_block(send, recv, op=MPI.SUM)

        def want() -> np.ndarray:
            return np.sum(comm.allgather(send), axis=0)[r * per:(r + 1) * per]
    else:
        send = rng.integers(0, 100, whole).astype(np.float32)
        recv = np.empty(whole, np.float32)
        fns = {a: (lambda a=a: team.alltoall(send, recv, algorithm=a).wait()) for a in ALGS[coll]}
        fns["MPI"] = lambda: comm.Alltoall(send, recv)

        def want() -> np.ndarray:
            every = comm.allgather(send)
            return np.concatenate([every[s][r * per:(r + 1) * per] for s in range(n)])
    expect = want()

    def check(name: str) -> None:
        recv[...] = -1
        fns[name]()
        if not np.array_equal(recv, expect):
            raise AssertionError(f"{coll} {name} {whole * 4} B: wrong result on rank {r}")
    return whole * 4, fns, check


def timed(comm: MPI.Comm, fns: dict, budget: float, repeat: int) -> dict:
    """Seconds per call of each fn: the slowest rank's mean over a loop, the best of ``repeat``
    loops; the fns take turns (each round runs every loop once) so that they see the same load."""
    iters = {}
    for name, fn in fns.items():
        fn()
        comm.Barrier()
        t = time.perf_counter()
        fn()
        one = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
        iters[name] = int(max(3, min(2000, budget / max(one, 1e-6))))
    best = {name: float("inf") for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(iters[name]):
                fn()
            mean = comm.allreduce((time.perf_counter() - t) / iters[name], op=MPI.MAX)
            best[name] = min(best[name], mean)
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--colls", default="allgather,reduce_scatter,alltoall")
    p.add_argument("--sizes", default="8,1K,64K,1M,16M")
    p.add_argument("--budget", type=float, default=0.3)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    team = Team.from_mpi(comm)
    for coll in args.colls.split(","):
        names = ALGS[coll] + ["MPI"]
        if comm.rank == 0:
            print(f"\n{coll} on {comm.size} ranks, us per call (best of {args.repeat})", flush=True)
            print(f"{'bytes':>10} " + " ".join(f"{nm:>10}" for nm in names), flush=True)
        for text in args.sizes.split(","):
            nbytes, fns, check = case(team, comm, coll, parse_bytes(text))
            for name in names:
                check(name)
            best = timed(comm, {name: fns[name] for name in names}, args.budget, args.repeat)
            row = [best[name] * 1e6 for name in names]
            if comm.rank == 0:
                print(f"{nbytes:>10} " + " ".join(f"{x:>10.1f}" for x in row), flush=True)


if __name__ == "__main__":
    main()
