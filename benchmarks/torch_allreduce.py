"""``dist.all_reduce`` on backend ``pycoll`` against ``gloo``, side by side in one run.

Both process groups span the same ranks; each size is timed on one backend then the other, several
rounds interleaved, so that drift on a shared machine hits both alike. Prints, on rank 0, the time
per call (median of the rounds) and algbw of each backend and the speedup (gloo time / pycoll time).

    torchrun --nproc-per-node 2 benchmarks/torch_allreduce.py
    pycoll run -n 2 -- python benchmarks/torch_allreduce.py --sizes 4,4M,128M
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import pycoll.torch  # noqa: F401 - registers the backend
from pycoll.config import parse_bytes


def iters_for(nbytes: int) -> int:
    """Calls per timing round: enough to last ~50 ms at a few GB/s, at least 3."""
    return max(3, min(2000, int(5e7 // max(nbytes, 1))))


def time_allreduce(t: torch.Tensor, group: dist.ProcessGroup, iters: int) -> float:
    """Seconds per call of ``iters`` back-to-back all_reduce calls (after a barrier)."""
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,4K,64K,1M,4M,16M,128M", help="message sizes in bytes (4M = 4 MiB)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per size")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("pycoll")
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"pycoll": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    if rank == 0:
        print(f"dist.all_reduce float32 SUM, {n} ranks, median of {args.rounds} rounds")
        print(f"{'bytes':>12} {'pycoll us':>11} {'gloo us':>11} {'pycoll GB/s':>12} {'gloo GB/s':>10} "
              f"{'speedup':>8}")
    for size in (parse_bytes(s) for s in args.sizes.split(",")):
        t = torch.ones(max(1, size // 4), dtype=torch.float32)
        iters = iters_for(t.nbytes)
        times = {name: [] for name in groups}
        for group in groups.values():  # warm up: connections, buffers, page faults
            time_allreduce(t, group, max(2, iters // 2))
        for _ in range(args.rounds):
            for name, group in groups.items():
                times[name].append(time_allreduce(t, group, iters))
        if rank == 0:
            med = {name: statistics.median(v) for name, v in times.items()}
            bw = {name: t.nbytes / s / 1e9 for name, s in med.items()}
            print(f"{t.nbytes:>12} {med['pycoll'] * 1e6:>11.1f} {med['gloo'] * 1e6:>11.1f} "
                  f"{bw['pycoll']:>12.2f} {bw['gloo']:>10.2f} {med['gloo'] / med['pycoll']:>7.2f}x",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
