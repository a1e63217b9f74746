"""``pycoll perf``: collective benchmarks in the style of UCC's perftest and nccl-tests.

Every size is measured for pycoll and, with ``--compare mpi``, for MPI's own collective in the
same run, alternating rounds so that drift on a shared machine hits both alike. Each rank times
``iters`` back-to-back blocking calls after a barrier; the table shows the mean over ranks of the
per-call time, its min and max over ranks, algbw = bytes / time and busbw = algbw * factor, with
nccl-tests' factor (allreduce: 2(n-1)/n).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from pycoll.config import parse_bytes
from pycoll.ops import as_dtype, as_op, check_op, reference

BUS_FACTOR: Dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n if n > 1 else 1.0,
}
COLLECTIVES = tuple(BUS_FACTOR)
ROUNDS = 2


def sizes(min_bytes: int, max_bytes: int, itemsize: int) -> List[int]:
    """Element counts from ``min_bytes`` to ``max_bytes``, doubling."""
    out, b = [], max(min_bytes, itemsize)
    while b <= max_bytes:
        out.append(max(1, b // itemsize))
        b *= 2
    return out


def auto_iters(nbytes: int) -> int:
    """Enough calls for ~20 ms of work at ~5 GB/s, between 5 and 1000."""
    return int(min(1000, max(5, 100e6 // max(nbytes, 1) // 5 if nbytes else 1000)))


def _input(count: int, dtype: np.dtype, rank: int) -> np.ndarray:
    return ((np.arange(count) % 7) + rank).astype(dtype)


def run(args: Any) -> int:
    """Benchmark under MPI (every rank runs this)."""
    from mpi4py import MPI

    from pycoll.team import Team

    comm = MPI.COMM_WORLD
    team = Team.from_mpi(comm)
    n, rank = team.size, team.rank
    dtype = as_dtype(args.dtype)
    op = as_op(args.op)
    check_op(op, dtype)
    mpi_op = getattr(MPI, "SUM" if op.name == "AVG" else op.name)
    algorithm = None if args.algorithm == "auto" else args.algorithm
    compare = args.compare == "mpi"
    factor = BUS_FACTOR[args.coll](n)
    counts = sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), dtype.itemsize)
    rows: List[Dict[str, Any]] = []
    if rank == 0:
        print(f"# pycoll perf {args.coll}: {n} ranks, {dtype}, op {op.name.lower()}, algorithm "
              f"{args.algorithm}, transport {_transports(team)}, machine {platform.node()} "
              f"({platform.machine()}, {_cpus()} cpus)")
        head = f"{'count':>10} {'bytes':>10} {'avg_us':>10} {'min_us':>10} {'max_us':>10} " \
               f"{'algbw':>7} {'busbw':>7}"
        if compare:
            head += f" | {'mpi_us':>10} {'mpi_algbw':>9} {'vs_mpi':>6}"
        print(head + ("  check" if args.check else ""))
        print(f"{'':>10} {'':>10} {'':>10} {'':>10} {'':>10} {'GB/s':>7} {'GB/s':>7}"
              + (f" | {'':>10} {'GB/s':>9} {'x':>6}" if compare else ""))
        sys.stdout.flush()
    # warm up the engine, the transport and MPI once before anything is timed
    warm_send, warm_recv = _input(counts[0], dtype, rank), np.empty(counts[0], dtype)
    for _ in range(200):
        team.allreduce(warm_send, warm_recv, op, algorithm=algorithm).wait()
        if compare:
            comm.Allreduce(warm_send, warm_recv, op=mpi_op)
    for i, count in enumerate(counts):
        nbytes = count * dtype.itemsize
        iters = args.iters or auto_iters(nbytes)
        warmup = args.warmup if args.warmup is not None else max(1, min(10, iters // 10))
        send = _input(count, dtype, rank)
        recv = np.empty_like(send)

        def pycoll_call(send: np.ndarray = send, recv: np.ndarray = recv) -> None:
            team.allreduce(send, recv, op, algorithm=algorithm).wait()

        def mpi_call(send: np.ndarray = send, recv: np.ndarray = recv) -> None:
            comm.Allreduce(send, recv, op=mpi_op)

        if rank == 0 and (nbytes >= 1 << 20 or i % 8 == 0):
            print(f"pycoll perf: {args.coll} {nbytes} B ({i + 1}/{len(counts)})", file=sys.stderr, flush=True)
        ok = ""
        if args.check:
            pycoll_call()
            want = reference([_input(count, dtype, r) for r in range(n)], op)
            good = np.array_equal(recv.astype(np.float64) if dtype.kind == "f" else recv,
                                  want.astype(np.float64) if dtype.kind == "f" else want)
            all_good = comm.allreduce(bool(good), op=MPI.LAND)
            ok = "  ok" if all_good else "  WRONG"
        t_py, t_mpi = [], []
        for _ in range(ROUNDS):
            t_py.append(_time(pycoll_call, iters, warmup, comm))
            if compare:
                t_mpi.append(_time(mpi_call, iters, warmup, comm))
        mine = float(np.mean(t_py))
        times = comm.allgather(mine)
        row: Dict[str, Any] = {"count": count, "bytes": nbytes, "iters": iters,
                               "avg_us": float(np.mean(times)) * 1e6, "min_us": min(times) * 1e6,
                               "max_us": max(times) * 1e6}
        row["algbw"] = nbytes / (row["avg_us"] * 1e-6) / 1e9 if row["avg_us"] else 0.0
        row["busbw"] = row["algbw"] * factor
        if compare:
            mpi_times = comm.allgather(float(np.mean(t_mpi)))
            row["mpi_us"] = float(np.mean(mpi_times)) * 1e6
            row["mpi_algbw"] = nbytes / (row["mpi_us"] * 1e-6) / 1e9 if row["mpi_us"] else 0.0
            row["vs_mpi"] = row["mpi_us"] / row["avg_us"] if row["avg_us"] else 0.0
        if args.check:
            row["check"] = ok.strip()
        rows.append(row)
        if rank == 0:
            line = f"{count:>10} {nbytes:>10} {row['avg_us']:>10.2f} {row['min_us']:>10.2f} " \
                   f"{row['max_us']:>10.2f} {row['algbw']:>7.3f} {row['busbw']:>7.3f}"
            if compare:
                line += f" | {row['mpi_us']:>10.2f} {row['mpi_algbw']:>9.3f} {row['vs_mpi']:>6.2f}"
            print(line + ok, flush=True)
    if rank == 0 and args.json:
        meta = {"coll": args.coll, "ranks": n, "dtype": str(dtype), "op": op.name.lower(),
                "algorithm": args.algorithm, "transport": _transports(team), "machine": platform.node(),
                "cpus": _cpus(), "python": platform.python_version(), "time": time.time()}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    failed = any(r.get("check") == "WRONG" for r in rows)
    return 1 if failed else 0


def _transports(team: Any) -> str:
    return f"shm+{team.transport.name}" if getattr(team, "shared", None) is not None else team.transport.name


def _time(call: Callable[[], None], iters: int, warmup: int, comm: Any) -> float:
    for _ in range(warmup):
        call()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def _cpus() -> Optional[int]:
    import os

    return os.cpu_count()
