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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

#: pycoll's names of algorithms the simulator names otherwise.
SIM_NAMES = {"rab": "rabenseifner"}


def pycoll(*args: str, env: Dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "pycoll.cli", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)


def rows(path: str, key: str) -> Dict[Tuple[str, int], float]:
    with open(path) as f:
        return {(r["algorithm"], r["bytes"]): r[key] for r in json.load(f)["rows"]}


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
    args = ap.parse_args()
    if args.cases:
        cases = [tuple(c.split(":", 1)) for c in args.cases.split(",")]
    else:
        cases = [(args.coll, a) for a in args.algorithm.split(",")]
    env = dict(os.environ, PYCOLL_TLS=os.environ.get("PYCOLL_TLS", "mpi"))
    models = ("by size", "plain") if args.plain else ("by size",)
    worst: Dict[Tuple[str, str, str], List[float]] = {}
    sizes = ["--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes]
    names = ", ".join(f"{c} {a}" for c, a in cases)
    print(f"# {names} on {args.ranks} ranks, PYCOLL_TLS={env['PYCOLL_TLS']}: simulated / measured "
          f"({args.calls} calls in a loop)")
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            perf, sim = os.path.join(tmp, "perf.json"), os.path.join(tmp, "sim.json")
            hosts = {m: os.path.join(tmp, f"{m.replace(' ', '_')}.toml") for m in models}
            for model, host in hosts.items():
                pycoll("sim", "calibrate", "--out", host, *(["--plain"] if model == "plain" else []), env=env)
            print(f"run {run + 1}")
            print(f"{'collective':>14} {'algorithm':>14} {'bytes':>10} {'measured_us':>12} "
                  + " ".join(f"{m + ' sim_us':>14} {'sim/meas':>9}" for m in models))
            for coll, alg in cases:
                pycoll("perf", coll, "-n", str(args.ranks), "--algorithm", alg, *sizes, "--json", perf,
                       env=env)
                measured = {b: t for (_, b), t in rows(perf, "avg_us").items()}
                name = SIM_NAMES.get(alg, alg)
                simulated = {}
                for model, host in hosts.items():
                    pycoll("sim", coll, "-n", str(args.ranks), "--machine", host, "--ppn", str(args.ranks),
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
