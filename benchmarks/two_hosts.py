"""Allreduce between two hosts: 2 + 2 ranks in two network namespaces joined by a veth pair (the
test bed of tests/procs/test_multihost.py), every team on UCX (``UCX_TLS=tcp,sm,self``: TCP between
the hosts, shared memory within one; UCX keeps namespaces apart), with native programs
(``PYCOLL_NATIVE_PROGRAMS=1``) against the Python path (``0``), launches alternated.

    python benchmarks/two_hosts.py [--rounds 2] [--per-host 2] [--no-pin] [--calibrate]  (root: ip netns)

Each host's ranks are pinned to its own share of the machine's cores (one core each on a 2-core
machine), as ranks on two machines share no core; ``--no-pin`` lets the scheduler put any rank
anywhere (then the ranks of a host believe they have every core and spin where they should yield).

Per size (8 B, 1 MiB, 16 MiB) and algorithm (the default selection, and ``rd``): the mean time of a
loop of blocking calls on the same arrays, the slowest rank's, in microseconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

SIZES = (8, 1 << 20, 16 << 20)
ALGORITHMS = (None, "rd")


def rank_main() -> None:
    """One rank (tests.launch.run_hosts sets RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    import numpy as np  # noqa: PLC0415

    from pycoll.sim.calibrate import rank_team  # noqa: PLC0415 - a team from the launch's store

    if os.environ.get("TWO_HOSTS_PIN") == "1":  # this host's share of the cores (ranks host by host)
        cores = sorted(os.sched_getaffinity(0))
        host = int(os.environ["RANK"]) * 2 // int(os.environ["WORLD_SIZE"])
        half = max(1, len(cores) // 2)
        os.sched_setaffinity(0, cores[host * half:(host + 1) * half] or cores[-half:])
    team = rank_team()
    rank, size = team.rank, team.size
    assert team.topology.n_nodes == 2 and team.transport.name == "ucx", (team.topology, team.transport)
    rows = []
    for nbytes in SIZES:
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        iters = 2000 if nbytes <= 4096 else 20
        for algorithm in ALGORITHMS:
            for _ in range(max(3, iters // 10)):
                team.allreduce(x, y, algorithm=algorithm).wait()
            team.barrier().wait()
            t0 = time.perf_counter()
            for _ in range(iters):
                team.allreduce(x, y, algorithm=algorithm).wait()
            us = (time.perf_counter() - t0) / iters * 1e6
            assert (y == size).all(), y[:4]
            slowest = np.zeros(size)
            team.allgather(np.array([us]), slowest).wait()
            name = algorithm or f"auto:{team.planner.select('allreduce', nbytes, None)}"
            rows.append((nbytes, name, slowest.max()))
    if rank == 0:
        for nbytes, algorithm, us in rows:
            print(f"ROW {nbytes} {algorithm} {us:.1f}", flush=True)
    team.close()
    print(f"RANK {rank} OK", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--calibrate", action="store_true",
                   help="also calibrate the simulator across the two hosts (pycoll.sim.calibrate) and "
                        "print its rd times next to the measured ones")
    p.add_argument("--per-host", type=int, default=2, help="ranks on each of the two hosts (default 2)")
    p.add_argument("--no-pin", action="store_true", help="do not pin each host's ranks to its own cores")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank:
        rank_main()
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.launch import run_hosts  # noqa: PLC0415 - the test bed's namespaces

    results: dict = {}
    for _ in range(a.rounds):
        for native in ("1", "0"):
            env = {"PYCOLL_TLS": "ucx", "UCX_TLS": "tcp,sm,self", "PYCOLL_NATIVE_PROGRAMS": native,
                   "TWO_HOSTS_PIN": "0" if a.no_pin else "1"}
            out = run_hosts("benchmarks/two_hosts.py", [a.per_host] * 2, "--rank", timeout=300, env=env)
            for line in out.splitlines():
                if line.startswith("ROW "):
                    _, nbytes, algorithm, us = line.split()
                    results.setdefault((int(nbytes), algorithm), {}).setdefault(native, []).append(float(us))
    pinned = "unpinned" if a.no_pin else "each host's ranks on its own cores"
    print(f"# allreduce, {a.per_host} + {a.per_host} ranks on two hosts (network namespaces, {pinned}), UCX "
          "over TCP between them; us per call, slowest rank")
    print(f"{'bytes':>10} {'algorithm':>16} {'native programs':>24} {'Python path':>24} {'speedup':>12}")
    for (nbytes, algorithm), by in sorted(results.items()):
        nat, py = by.get("1", []), by.get("0", [])
        span = f"{min(py) / max(nat):.2f}-{max(py) / min(nat):.2f}x" if nat and py else "-"
        print(f"{nbytes:>10} {algorithm:>16} {', '.join(f'{v:.1f}' for v in nat):>24} "
              f"{', '.join(f'{v:.1f}' for v in py):>24} {span:>12}")
    if a.calibrate:
        simulated(run_hosts, results, a.per_host)
    return 0


def simulated(run_hosts: Any, results: dict, per_host: int) -> None:
    """Calibrate the simulator across the two hosts and print its rd allreduce times next to the
    measured ones (simulated / measured, for each measured run)."""
    import tempfile  # noqa: PLC0415

    from pycoll.sim import load, programs, run  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "hosts.toml")
        run_hosts("tests/procs/scripts/calibrate_hosts.py", [per_host] * 2, path, "--steps", "200",
                  "--repeats", "3", timeout=300, env={"PYCOLL_TLS": "ucx", "UCX_TLS": "tcp,sm,self"})
        machine = load(path)
    print(f"# simulated (pycoll sim, calibrated across the hosts: {machine.describe()})")
    print(f"{'bytes':>10} {'simulated':>12} {'sim / measured (native, Python)':>40}")
    for nbytes in SIZES:
        sim = run(programs("allreduce", "rd", 2 * per_host, nbytes), machine).time * 1e6
        by = results.get((nbytes, "rd"), {})
        ratios = ", ".join(f"{sim / v:.2f}" for v in by.get("1", []) + by.get("0", []))
        print(f"{nbytes:>10} {sim:>12.1f} {ratios:>40}")


if __name__ == "__main__":
    sys.exit(main())
