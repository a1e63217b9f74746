"""DDP training step time on backend ``pycoll`` against ``gloo`` (and with pycoll's priority hook).

One MLP, the same data, the same seed: each variant trains ``--steps`` steps after ``--warmup``
steps, variants interleaved over ``--rounds`` rounds; rank 0 prints the median step time of each
and its speedup over gloo. The model is sized so that its gradients (``--width`` and ``--layers``)
make communication matter next to the computation.

    torchrun --nproc-per-node 2 benchmarks/torch_ddp.py
    pycoll run -n 2 -- python benchmarks/torch_ddp.py --width 2048 --layers 6
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import pycoll.torch  # noqa: F401 - registers the backend
from pycoll.torch import PriorityHookState, priority_hook


def make_model(width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    mods: list = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, 1))


def step_time(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int,
              group: Optional[dist.ProcessGroup] = None) -> float:
    """Seconds per training step over ``steps`` steps (the ranks of ``group`` start together)."""
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return (time.perf_counter() - start) / steps


def options(description: str) -> argparse.Namespace:
    """The model, batch and timing options of the torch training benchmarks."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--width", type=int, default=1024, help="hidden width (default 1024)")
    ap.add_argument("--layers", type=int, default=8, help="hidden layers (default 8)")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step (default 32)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per round (default 5)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    return ap.parse_args()


def main() -> None:
    args = options(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    dist.init_process_group("pycoll")
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    variants = {}
    for name, group, hook in (("gloo", gloo, False), ("pycoll", None, False), ("pycoll+hook", None, True)):
        model = DDP(make_model(args.width, args.layers), process_group=group)
        if hook:
            model.register_comm_hook(PriorityHookState(), priority_hook)
        variants[name] = (model, torch.optim.SGD(model.parameters(), lr=1e-4))
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank))
    nparams = sum(p.numel() for p in variants["gloo"][0].parameters())
    times: dict = {name: [] for name in variants}
    for model, opt in variants.values():
        step_time(model, opt, x, args.warmup)
    for _ in range(args.rounds):
        for name, (model, opt) in variants.items():
            times[name].append(step_time(model, opt, x, args.steps))
    if rank == 0:
        print(f"DDP MLP {args.layers}x{args.width} ({nparams * 4 / 2**20:.0f} MiB of float32 gradients), "
              f"batch {args.batch}, {dist.get_world_size()} ranks, median of {args.rounds} rounds")
        base = statistics.median(times["gloo"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:<12} {med * 1e3:8.1f} ms/step   {base / med:5.2f}x gloo", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
