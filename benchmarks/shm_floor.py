"""How close the shared-memory allreduce gets to what memory allows on this machine.

Measures the machine's copy bandwidth (numpy, 128 MiB, counted as read + write), works out the
floor of a 2-rank allreduce that reads each input once, reduces each half on one rank and copies
the other half across (5 * M bytes moved for M bytes: about 640 MB for 128 MiB), then runs
``pycoll perf allreduce -n 2 --compare mpi`` at 32 MiB and 128 MiB and prints pycoll's and MPI's
times as fractions of that floor.

    python benchmarks/shm_floor.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def copy_bandwidth(nbytes: int = 128 << 20, repeat: int = 5) -> float:
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best  # read + write


def main() -> None:
    bw = copy_bandwidth()
    print(f"copy bandwidth (read + write): {bw / 1e9:.1f} GB/s on {os.cpu_count()} cpus")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "perf.json")
        subprocess.run([sys.executable, "-m", "pycoll.cli", "perf", "allreduce", "-n", "2", "--min-bytes",
                        "32M", "--max-bytes", "128M", "--compare", "mpi", "--check", "--json", out],
                       check=True, timeout=900)
        with open(out) as f:
            rows = json.load(f)["rows"]
    print(f"{'bytes':>12} {'floor ms':>9} {'pycoll ms':>10} {'floor/pycoll':>13} {'mpi ms':>8} "
          f"{'floor/mpi':>10}")
    for row in rows:
        floor = 5 * row["bytes"] / bw
        print(f"{row['bytes']:>12} {floor * 1e3:>9.2f} {row['avg_us'] / 1e3:>10.2f} "
              f"{floor / (row['avg_us'] * 1e-6):>13.2f} {row['mpi_us'] / 1e3:>8.2f} "
              f"{floor / (row['mpi_us'] * 1e-6):>10.2f}")


if __name__ == "__main__":
    main()
