"""Point-to-point algorithms on one host's single-copy path: native programs against Python.

Run under mpiexec (the ranks make two teams over a TCP store, whose point-to-point transport is
the shared segment's descriptor rings with process_vm_readv reads), e.g.::

    mpiexec -n 4 python benchmarks/shm_programs.py [--cases allreduce:rd,alltoall:pairwise]
        [--sizes 8,4K,64K,1M] [--budget 0.2] [--repeat 3]

One team runs lowered programs in the native executor (``native/exec_shm.c``), the other has
``PYCOLL_NATIVE_PROGRAMS=0`` and runs the same algorithms' schedules in Python; MPI's own
collective runs beside them. For each case and size it prints the time per call in microseconds
(the slowest rank's mean over a loop of about ``--budget`` seconds; the spread over ``--repeat``
rounds, which take turns) and native's speed-up over Python. Results are checked against MPI's.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

from pycoll import Team
from pycoll.config import parse_bytes
from pycoll.store import TCPStore

CASES = "allreduce:rd,allreduce:ring,bcast:knomial,allgather:bruck,alltoall:pairwise"


def team(store: TCPStore, native: bool) -> Team:
    """A team over ``store`` whose planner runs lowered programs natively or not."""
    world = MPI.COMM_WORLD
    os.environ["PYCOLL_NATIVE_PROGRAMS"] = "1" if native else "0"
    t = Team.from_store(store, world.rank, world.size, tls=["shm", "tcp"])
    del os.environ["PYCOLL_NATIVE_PROGRAMS"]
    if t.transport.name != "shm":
        raise SystemExit(f"no single-copy point to point here: the team's transport is {t.transport.name}")
    return t


def case(t: Team, comm: MPI.Comm, coll: str, alg: str, nbytes: int):
    """(call of pycoll, call of MPI, pycoll's output, MPI's output) of one size."""
    n, r = comm.size, comm.rank
    per = max(1, nbytes // (4 * n)) if coll in ("allgather", "alltoall") else max(1, nbytes // 4)
    rng = np.random.default_rng(r)
    if coll == "allreduce":
        x = rng.integers(-5, 5, per).astype(np.float32)
        out, ref = np.empty_like(x), np.empty_like(x)
        return (lambda: t.allreduce(x, out, algorithm=alg).wait()), (lambda: comm.Allreduce(x, ref)), out, ref
    if coll == "bcast":
        x = np.arange(per, dtype=np.float32)
        y = x.copy()
        return (lambda: t.bcast(x, 0, algorithm=alg).wait()), (lambda: comm.Bcast(y, 0)), x, y
    x = rng.integers(0, 100, per * (n if coll == "alltoall" else 1)).astype(np.float32)
    out, ref = np.empty(per * n, np.float32), np.empty(per * n, np.float32)
    if coll == "allgather":
        return (lambda: t.allgather(x, out, algorithm=alg).wait()), (lambda: comm.Allgather(x, ref)), out, ref
    return (lambda: t.alltoall(x, out, algorithm=alg).wait()), (lambda: comm.Alltoall(x, ref)), out, ref


def timed(fn, comm: MPI.Comm, budget: float) -> float:
    """The slowest rank's mean time of ``fn`` in microseconds over a loop of about ``budget`` s."""
    fn()
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    once = comm.allreduce(time.perf_counter() - t0, MPI.MAX)
    iters = max(3, min(100_000, int(budget / max(once, 1e-7))))
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return comm.allreduce((time.perf_counter() - t0) / iters, MPI.MAX) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default=CASES, help="coll:algorithm,... (default %(default)s)")
    p.add_argument("--sizes", default="8,4K,64K,1M", help="bytes (default %(default)s)")
    p.add_argument("--budget", type=float, default=0.2, help="seconds per timed loop")
    p.add_argument("--repeat", type=int, default=3, help="rounds (they take turns)")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    server = TCPStore(port=0, is_master=True, timeout=60) if comm.rank == 0 else None
    port = comm.bcast(server.port if server is not None else None)
    store = TCPStore("127.0.0.1", port, timeout=60)
    teams = {"native": team(store, True), "python": team(store, False)}
    if comm.rank == 0:
        print(f"{comm.size} ranks, one host; us per call (slowest rank's mean; min-max of {a.repeat} rounds)")
        print(f"{'case':22} {'bytes':>8} {'native':>15} {'python':>15} {'MPI':>15} {'python/native':>14}")
    for spec in a.cases.split(","):
        coll, alg = spec.split(":")
        for nbytes in (parse_bytes(s) for s in a.sizes.split(",")):
            runs = {}
            for name, t in teams.items():
                mine, theirs, out, ref = case(t, comm, coll, alg, nbytes)
                mine()
                theirs()
                if not np.array_equal(out, ref):
                    raise SystemExit(f"{spec} {nbytes} B on {name}: not MPI's answer on rank {comm.rank}")
                runs[name] = mine
            runs["MPI"] = theirs
            times = {k: [] for k in runs}
            for _ in range(a.repeat):
                for k, fn in runs.items():
                    times[k].append(timed(fn, comm, a.budget))
            if comm.rank == 0:
                cols = " ".join(f"{min(v):7.1f}-{max(v):<7.1f}" for v in times.values())
                ratio = f"{min(times['python']) / max(times['native']):.1f}-" \
                        f"{max(times['python']) / min(times['native']):.1f}x"
                print(f"{spec:22} {nbytes:>8} {cols} {ratio:>14}", flush=True)
    for t in teams.values():
        t.close()


if __name__ == "__main__":
    main()
