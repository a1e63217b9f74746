"""How close the simulator comes to this host: calibrate it (``pycoll sim calibrate``), then in the
same run measure the algorithms with ``pycoll perf`` on the transport calibrated, simulate them
with ``pycoll sim`` on the machine file, and print simulated / measured per size; ``--runs``
times over (the host drifts: each run calibrates afresh).

    python benchmarks/sim_accuracy.py                                 # allreduce rd, 2 ranks, MPI
    python benchmarks/sim_accuracy.py --algorithm rd,rab,knomial --runs 3
    python benchmarks/sim_accuracy.py --cases allreduce:rd,allgather:rd,alltoall:pairwise,bcast:knomial \
        --min-bytes 4K --max-bytes 64M                                # the collectives a fit is judged on

The machine file is the calibration's (rates and latencies by size, measured through a pair's
collectives); ``--plain`` adds the simulation on the plain model (one bandwidth, alpha from Python
ping-pongs) beside it, on the same measured times. The simulation is of ``--calls`` calls in a
loop, as ``pycoll perf`` times them; on more ranks than the calibration's 2, all on this host
(``--ppn``).

``--hosts`` (root: ``ip netns``) puts the ranks on two hosts instead: two network namespaces joined
by a veth pair (the test bed of tests/procs/test_multihost.py), half the ranks in each, each host's
ranks pinned to its own half of the cores, UCX over TCP between them (``UCX_TLS=tcp,sm,self``).
The calibration runs across them (the network's parameters between the two hosts), and the ranks
time each case in a loop as ``pycoll perf`` does (its warm-up, rounds and calls per size; the
ranks' mean), since ``pycoll perf`` itself needs MPI's launcher, which cannot start ranks in
namespaces.

    python benchmarks/sim_accuracy.py --hosts -n 2 --min-bytes 4K --max-bytes 64M --runs 3 \
        --cases allreduce:rd,allgather:rd,alltoall:pairwise,bcast:knomial
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

#: pycoll's names of algorithms the simulator names otherwise.
SIM_NAMES = {"rab": "rabenseifner"}


def pycoll(*args: str, env: Dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "pycoll.cli", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)


def rows(path: str, key: str) -> Dict[Tuple[str, int], float]:
    with open(path) as f:
        return {(r["algorithm"], r["bytes"]): r[key] for r in json.load(f)["rows"]}


def sim_sizes(min_bytes: str, max_bytes: str) -> List[int]:
    """The sizes ``pycoll sim`` runs between the two (each 4 times the last)."""
    from pycoll.config import parse_bytes  # noqa: PLC0415

    out, size = [], max(1, parse_bytes(min_bytes))
    while size <= parse_bytes(max_bytes):
        out.append(size)
        size *= 4
    return out


def host_call(team: Any, coll: str, alg: str, nbytes: int) -> Callable[[], Any]:
    """One call of ``coll`` by ``alg`` of nominal ``nbytes`` (float32, as ``pycoll perf`` sizes it:
    the buffer; allgather's and alltoall's the n blocks together), on new arrays."""
    import numpy as np  # noqa: PLC0415

    from pycoll.sim.programs import elements  # noqa: PLC0415

    count = elements(coll, nbytes, team.size, 4)
    whole = count * (team.size if coll in ("allgather", "alltoall") else 1)
    src = np.ones(count if coll == "allgather" else whole, np.float32)
    dst = np.empty(whole, np.float32)
    if coll == "bcast":
        return lambda: team.bcast(dst, 0, algorithm=alg).wait()
    return lambda: getattr(team, coll)(src, dst, algorithm=alg).wait()


def pin_to_host() -> None:
    """Pin this rank (of ``--hosts``: ranks numbered host by host) to its host's half of the
    cores, as ranks on two machines share no core."""
    cores = sorted(os.sched_getaffinity(0))
    host = int(os.environ["RANK"]) * 2 // int(os.environ["WORLD_SIZE"])
    half = max(1, len(cores) // 2)
    os.sched_setaffinity(0, cores[host * half:(host + 1) * half] or cores[-half:])


def calibrate_rank(out: str, plain: bool, steps: int, repeats: int) -> None:
    """One rank of ``--hosts``'s calibration: pinned as the timed ranks are, the calibration's own
    rank code (``python -m pycoll.sim.calibrate``), then ``RANK r OK``."""
    from pycoll.sim import calibrate  # noqa: PLC0415

    pin_to_host()
    sys.argv = [sys.argv[0], "--out", out, "--steps", str(steps), "--repeats", str(repeats),
                *(["--plain"] if plain else [])]
    calibrate.main()
    print(f"RANK {os.environ['RANK']} OK", flush=True)


def rank_main(cases: List[Tuple[str, str]], sizes: List[int], rows_out: str) -> None:
    """One rank of ``--hosts`` (tests.launch.run_hosts sets RANK, WORLD_SIZE, MASTER_ADDR/PORT):
    pinned to its host's half of the cores, it times each case at each size as ``pycoll perf``
    does (warm-up, then ``ROUNDS`` timed loops of ``auto_iters`` calls after a barrier; the mean);
    rank 0 writes ``coll alg bytes us`` lines to ``rows_out`` (the ranks' mean; the bytes the call
    moves, as the simulator counts them), then every rank prints ``RANK r OK``."""
    import numpy as np  # noqa: PLC0415

    from pycoll.perf import ROUNDS, auto_iters  # noqa: PLC0415
    from pycoll.sim.calibrate import rank_team  # noqa: PLC0415
    from pycoll.sim.programs import moved  # noqa: PLC0415

    pin_to_host()
    team = rank_team()
    lines = []
    for coll, alg in cases:
        for nbytes in sizes:
            call = host_call(team, coll, alg, nbytes)
            iters = auto_iters(nbytes)
            rounds = []
            for _ in range(ROUNDS):
                for _ in range(max(2, min(10, iters // 10))):
                    call()
                team.barrier().wait()
                t0 = time.perf_counter()
                for _ in range(iters):
                    call()
                rounds.append((time.perf_counter() - t0) / iters)
            every = np.zeros(team.size)
            team.allgather(np.array([float(np.mean(rounds))]), every).wait()
            lines.append(f"{coll} {alg} {moved(coll, alg, nbytes, team.size, 4)} {every.mean() * 1e6:.3f}\n")
    if team.rank == 0:
        with open(rows_out, "w") as f:
            f.writelines(lines)
    team.close()
    print(f"RANK {os.environ['RANK']} OK", flush=True)


def on_hosts(args: argparse.Namespace, cases: List[Tuple[str, str]], hosts: Dict[str, str],
             sizes: List[int]) -> Dict[Tuple[str, str], Dict[int, float]]:
    """``--hosts``: calibrate each model across the two hosts into ``hosts[model]``, then time the
    cases there; the measured times by (collective, algorithm) and size."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.launch import run_hosts  # noqa: PLC0415 - the test bed's namespaces

    per_host = [args.ranks // 2] * 2
    env = {"PYCOLL_TLS": "ucx", "UCX_TLS": "tcp,sm,self"}
    for model, path in hosts.items():
        run_hosts("benchmarks/sim_accuracy.py", per_host, "--rank", "--calibrate-out", path, "--steps",
                  str(args.steps), "--repeats", str(args.repeats),
                  *(["--plain"] if model == "plain" else []), timeout=300, env=env)
    spec = ",".join(f"{c}:{a}" for c, a in cases)
    rows_out = str(Path(next(iter(hosts.values()))).with_name("hosts_rows.txt"))
    run_hosts("benchmarks/sim_accuracy.py", per_host, "--rank", "--cases", spec, "--min-bytes",
              args.min_bytes, "--max-bytes", args.max_bytes, "--rows-out", rows_out, timeout=900, env=env)
    measured: Dict[Tuple[str, str], Dict[int, float]] = {}
    with open(rows_out) as f:
        lines = f.read().split()
    for k in range(0, len(lines), 4):
        coll, alg, nbytes, us = lines[k:k + 4]
        measured.setdefault((coll, alg), {})[int(nbytes)] = float(us)
    if len(lines) != 4 * len(cases) * len(sizes):
        raise SystemExit(f"sim_accuracy: the ranks timed {len(lines) // 4} cases x sizes, not "
                         f"{len(cases) * len(sizes)}")
    return measured


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coll", default="allreduce")
    ap.add_argument("--algorithm", default="rd")
    ap.add_argument("--cases", default=None,
                    help="collective:algorithm pairs, comma-separated (instead of --coll and --algorithm)")
    ap.add_argument("-n", "--ranks", type=int, default=2)
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="4M")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--calls", type=int, default=8, help="calls in the simulated loop (per call reported)")
    ap.add_argument("--plain", action="store_true", help="also simulate on the plain model")
    ap.add_argument("--hosts", action="store_true",
                    help="half the ranks on each of two hosts (network namespaces; root)")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--calibrate-out", help=argparse.SUPPRESS)
    ap.add_argument("--rows-out", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=1000, help="the calibration's steps (pycoll sim calibrate)")
    ap.add_argument("--repeats", type=int, default=5, help="the calibration's repeats (the median is kept)")
    args = ap.parse_args()
    if args.cases:
        cases = [tuple(c.split(":", 1)) for c in args.cases.split(",")]
    else:
        cases = [(args.coll, a) for a in args.algorithm.split(",")]
    if args.rank and args.calibrate_out:
        calibrate_rank(args.calibrate_out, args.plain, args.steps, args.repeats)
        return
    if args.rank:
        rank_main(cases, sim_sizes(args.min_bytes, args.max_bytes), args.rows_out)
        return
    if args.hosts and (args.ranks < 2 or args.ranks % 2):
        ap.error("--hosts needs an even number of ranks, at least 2 (half on each host)")
    env = dict(os.environ, PYCOLL_TLS="ucx" if args.hosts else os.environ.get("PYCOLL_TLS", "mpi"))
    if args.hosts:
        env["UCX_TLS"] = "tcp,sm,self"
    ppn = args.ranks // 2 if args.hosts else args.ranks
    models = ("by size", "plain") if args.plain else ("by size",)
    worst: Dict[Tuple[str, str, str], List[float]] = {}
    sizes = ["--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes]
    names = ", ".join(f"{c} {a}" for c, a in cases)
    where = "two hosts (network namespaces, UCX over TCP)" if args.hosts else "this host"
    print(f"# {names} on {args.ranks} ranks on {where}, PYCOLL_TLS={env['PYCOLL_TLS']}: simulated / "
          f"measured ({args.calls} calls in a loop)")
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            perf, sim = os.path.join(tmp, "perf.json"), os.path.join(tmp, "sim.json")
            hosts = {m: os.path.join(tmp, f"{m.replace(' ', '_')}.toml") for m in models}
            if args.hosts:
                across = on_hosts(args, cases, hosts, sim_sizes(args.min_bytes, args.max_bytes))
            else:
                for model, host in hosts.items():
                    pycoll("sim", "calibrate", "--out", host, "--steps", str(args.steps), "--repeats",
                       str(args.repeats), *(["--plain"] if model == "plain" else []), env=env)
            print(f"run {run + 1}")
            print(f"{'collective':>14} {'algorithm':>14} {'bytes':>10} {'measured_us':>12} "
                  + " ".join(f"{m + ' sim_us':>14} {'sim/meas':>9}" for m in models))
            for coll, alg in cases:
                if args.hosts:
                    measured = across.get((coll, alg), {})
                else:
                    pycoll("perf", coll, "-n", str(args.ranks), "--algorithm", alg, *sizes, "--json", perf,
                           env=env)
                    measured = {b: t for (_, b), t in rows(perf, "avg_us").items()}
                name = SIM_NAMES.get(alg, alg)
                simulated = {}
                for model, host in hosts.items():
                    pycoll("sim", coll, "-n", str(args.ranks), "--machine", host, "--ppn", str(ppn),
                           "--calls", str(args.calls), *sizes, "--json", sim, "--algorithm", name, env=env)
                    simulated[model] = {b: t for (_, b), t in rows(sim, "time_us").items()}
                for b in sorted(set(measured).intersection(*simulated.values())):
                    line = f"{coll:>14} {name:>14} {b:>10} {measured[b]:>12.2f}"
                    for model in models:
                        ratio = simulated[model][b] / measured[b]
                        worst.setdefault((model, coll, name), []).append(ratio)
                        line += f" {simulated[model][b]:>14.2f} {ratio:>9.2f}"
                    print(line, flush=True)
    for model in models:
        total = within = 0
        for (m, coll, alg), ratios in worst.items():
            if m != model:
                continue
            ok = sum(abs(r - 1) <= 0.25 for r in ratios)
            total, within = total + len(ratios), within + ok
            print(f"# {model}: {coll} {alg}: simulated / measured from {min(ratios):.2f} to "
                  f"{max(ratios):.2f} ({len(ratios)} sizes x runs); within 25%: {ok}")
        print(f"# {model}: all: {within} of {total} within 25%")


if __name__ == "__main__":
    main()
