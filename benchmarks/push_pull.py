"""BytePS push-sum-pull against a ring all-reduce when the network is the bottleneck.

Every process (workers and summation servers) is held to ``--bw`` bytes per second of sends by
``PYCOLL_BW_LIMIT`` (one token bucket per process, like one NIC), so that on one machine the
network, not memory, decides. For each number of servers ``k`` the driver makes one launch of
``n`` workers and ``k`` servers (``pycoll.launch.launch(n, ..., servers=k)``, what
``pycoll run -n N --servers K`` does) and, on the workers, times interleaved rounds of

* ``team.push_pull(x, out, name=...)``: BytePS's split over the workers' colocated services and
  the k servers;
* ``team.allreduce(x, out, algorithm="ring", tag=...)``: tagged, so that it goes point to point
  through the limiter (an untagged one would use the shared segment);

then prints the measured speedup (ring time / push_pull time) next to BytePS's predictions
(OSDI'20, section 4.1): over all-reduce ``(n^2+kn-2k)/n^2`` (k = 1, 2, 4 of n = 4: 1.125, 1.25, 1.5),
over a plain PS of k servers ``max(n/k, 1)(n^2+kn-2k)/(2n(n-1))``, and the traffic per role of one
push_pull against the formula (a worker ``M + (n-2)M_gpu``, a server ``n*M_cpu``)::

    python benchmarks/push_pull.py [--n 4] [--ks 0,1,2,4] [--size 64M] [--bw 200M] [--rounds 5]

A time is the slowest worker's for one call (every worker starts after a barrier), the figure the
median of ``--rounds`` rounds. With ``--rank`` it is one process of such a launch (the driver's
business).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

from pycoll.config import parse_bytes


def predicted(n: int, k: int) -> Dict[str, Any]:
    """BytePS's speedups: over a ring all-reduce, and over a plain PS of k servers (None: k = 0)."""
    if k > n:  # more servers than BytePS can use: as k = n
        k = n
    total = n * n + k * n - 2 * k
    return {"vs_ring": total / (n * n), "vs_ps": max(n / k, 1) * total / (2 * n * (n - 1)) if k else None}


# ------------------------------------------------------------------------------------- one rank
def rank_main(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from pycoll import Team, config
    from pycoll.perf import role_traffic

    team = Team.from_mpi(MPI.COMM_WORLD)  # a server serves inside and leaves with SystemExit(0)
    comm = team.comm.Dup()  # the workers only
    n, k, rank = team.size, (team._ps.k if team._ps is not None else 0), team.rank
    nbytes = parse_bytes(args.size)
    count = nbytes // 4
    x = ((np.arange(count) % 13) + rank).astype(np.float32)
    out = np.empty_like(x)
    want = sum(((np.arange(count) % 13) + r).astype(np.float32) for r in range(n))

    def push_pull() -> None:
        team.push_pull(x, out, name="bench").wait()

    def ring() -> None:
        team.allreduce(x, out, algorithm="ring", tag="bench-ring").wait()

    calls = {"push_pull": push_pull, "ring": ring}
    for name, call in calls.items():  # warm up (connections, buffers, the servers' declaration) and check
        out.fill(-1)
        call()
        assert np.array_equal(out, want), f"{name} wrong on worker {rank}"
    times: Dict[str, List[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            comm.Barrier()
            t0 = time.perf_counter()
            call()
            times[name].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    traffic = role_traffic(team, comm, push_pull, nbytes, 1)
    comm.Barrier()
    team.reset_traffic()  # the ring runs on the workers' team, not on the team of workers and servers
    ring()
    t = team.traffic(include_self=False)["total"]
    every = comm.allgather((t["sent"], t["received"]))
    ring_traffic = {"sent": float(np.mean([e[0] for e in every])),
                    "received": float(np.mean([e[1] for e in every]))}
    if rank == 0:
        result = {"n": n, "k": k, "bytes": nbytes, "bw": config.get("PYCOLL_BW_LIMIT"),
                  "transport": team.transport.name, "times": times, "traffic": traffic,
                  "ring_traffic": ring_traffic}
        with open(args.out, "w") as f:
            json.dump(result, f)
    comm.Free()
    team.close()


# ------------------------------------------------------------------------------------- driver
def driver(args: argparse.Namespace) -> int:
    from pycoll.launch import launch

    ks = [int(k) for k in args.ks.split(",")]
    n, nbytes, bw = args.n, parse_bytes(args.size), parse_bytes(args.bw)
    ring_bytes = 2 * (n - 1) * nbytes / n
    print(f"push_pull vs ring all-reduce: n = {n} workers, k = {args.ks} servers, {nbytes} B float32, "
          f"PYCOLL_BW_LIMIT={args.bw} ({bw / 1e6:.0f} MB/s of sends per process), "
          f"PYCOLL_PARTITION_BYTES={args.partition or 'unset (push_pull: 4M parts)'}, {args.rounds} "
          f"interleaved rounds (median of the slowest worker's time), {os.cpu_count()} cpus", flush=True)
    results = []
    for k in ks:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--rank", "--size", args.size, "--rounds",
                   str(args.rounds), "--out", out]
            env = {"PYCOLL_BW_LIMIT": args.bw, "PYCOLL_NUM_SERVERS": "0", "PYCOLL_TIMEOUT": str(args.timeout)}
            if args.tls:
                env["PYCOLL_TLS"] = args.tls
            if args.partition:
                env["PYCOLL_PARTITION_BYTES"] = args.partition
            t0 = time.monotonic()
            rc = launch(n, cmd, timeout=args.timeout, env=env, servers=k)
            if rc != 0:
                print(f"k = {k}: the launch failed (exit {rc})", file=sys.stderr)
                return rc
            with open(out) as f:
                r = json.load(f)
            r["wall_s"] = time.monotonic() - t0
            results.append(r)
        t_pp, t_ring = (statistics.median(r["times"][x]) for x in ("push_pull", "ring"))
        print(f"  k = {k}: push_pull {t_pp * 1e3:.1f} ms, ring {t_ring * 1e3:.1f} ms "
              f"({r['wall_s']:.1f} s launch)", flush=True)
    print()
    print(f"{'k':>2} {'push_pull_ms':>12} {'ring_ms':>8} {'speedup':>8} {'best':>6} {'predicted':>9} "
          f"{'vs_PS_pred':>10} {'ideal_pp_ms':>11} {'ideal_ring_ms':>13} {'worker_B':>11} {'formula':>11} "
          f"{'server_B':>11} {'formula':>11}")
    for r in results:
        k = r["k"]
        t_pp, t_ring = (statistics.median(r["times"][x]) for x in ("push_pull", "ring"))
        best = min(r["times"]["ring"]) / min(r["times"]["push_pull"])
        p = predicted(n, k)
        tr = r["traffic"]
        worker, server = tr["worker"], tr["server"]
        busiest = max(worker["sent"], server["sent"] if server else 0)  # the NIC that finishes last
        vs_ps = f"{p['vs_ps']:>10.3f}" if p["vs_ps"] is not None else f"{'-':>10}"
        srv = f"{server['sent']:>11.0f} {server['formula']:>11.0f}" if server else f"{'-':>11} {'-':>11}"
        print(f"{k:>2} {t_pp * 1e3:>12.1f} {t_ring * 1e3:>8.1f} {t_ring / t_pp:>8.3f} {best:>6.3f} "
              f"{p['vs_ring']:>9.3f} "
              f"{vs_ps} {busiest / bw * 1e3:>11.1f} {ring_bytes / bw * 1e3:>13.1f} "
              f"{worker['sent']:>11.0f} {worker['formula']:>11.0f} {srv}")
    print("\nspeedup = ring_ms / push_pull_ms (medians); best = fastest ring / fastest push_pull; "
          "predicted = (n^2+kn-2k)/n^2;\nvs_PS_pred = max(n/k,1)(n^2+kn-2k)/(2n(n-1)) (predicted speedup "
          "over a plain PS of k servers); ideal_*_ms = bytes sent by the busiest process / PYCOLL_BW_LIMIT;\n"
          "worker_B, server_B = bytes sent per push_pull (means over the role; received: the same), "
          "formula = M+(n-2)M_gpu and n*M_cpu")
    for r in results:
        rt = r["ring_traffic"]
        print(f"k = {r['k']}: ring all-reduce worker sent {rt['sent']:.0f} B, received "
              f"{rt['received']:.0f} B (2(n-1)/n*M = {ring_bytes:.0f}); all times (ms) push_pull "
              f"{[round(t * 1e3, 1) for t in r['times']['push_pull']]}, ring "
              f"{[round(t * 1e3, 1) for t in r['times']['ring']]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4, help="workers (default 4)")
    p.add_argument("--ks", default="0,1,2,4", help="numbers of servers, one launch each (default 0,1,2,4)")
    p.add_argument("--size", default="64M", help="tensor bytes (float32; default 64M)")
    p.add_argument("--bw", default="200M", help="PYCOLL_BW_LIMIT of every process (default 200M)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    p.add_argument("--tls", default=None, help="PYCOLL_TLS for the launches (default: pycoll's)")
    p.add_argument("--partition", default=None,
                   help="PYCOLL_PARTITION_BYTES for the launches: push_pull's parts (default 4M) and the "
                        "ring's fragments (default none)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per launch (default 300)")
    p.add_argument("--json", default=None, help="write every launch's figures to this file")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        rank_main(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
