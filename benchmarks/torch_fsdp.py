"""FSDP2 (``fully_shard``) training step time on backend ``pycoll`` against ``gloo``.

One MLP sharded layer by layer, the same data and seed: each backend trains ``--steps`` steps
after ``--warmup`` steps, the two interleaved over ``--rounds`` rounds; rank 0 prints the median
step time of each and gloo's time over pycoll's (above 1: pycoll is faster). FSDP2 all-gathers
each layer's parameters before its forward and backward and reduce-scatters its gradients.

    torchrun --nproc-per-node 2 benchmarks/torch_fsdp.py
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch_ddp import options, step_time  # (this folder: the DDP benchmark's options and timer)

import pycoll.torch  # noqa: F401 - registers the backend


def make_model(width: int, layers: int, mesh: DeviceMesh) -> nn.Module:
    torch.manual_seed(0)
    mods: list = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*mods, nn.Linear(width, 1))
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def main() -> None:
    args = options(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    dist.init_process_group("pycoll")
    groups = {"pycoll": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(dist.get_rank()))
    runs = {}
    for name, group in groups.items():
        model = make_model(args.width, args.layers, DeviceMesh.from_group(group, "cpu"))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        step_time(model, opt, x, args.warmup, group)
        runs[name] = (model, opt, group)
    times: dict = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (model, opt, group) in runs.items():
            times[name].append(step_time(model, opt, x, args.steps, group))
    if dist.get_rank() == 0:
        med = {name: statistics.median(t) for name, t in times.items()}
        params = sum(p.numel() for p in runs["pycoll"][0].parameters())  # (DTensors: global sizes)
        print(f"FSDP2, {dist.get_world_size()} ranks, {params / 1e6:.1f} M parameters (float32), "
              f"batch {args.batch} per rank, {args.rounds} rounds of {args.steps} steps:")
        for name, t in times.items():
            spread = f"{min(t) * 1e3:.1f}-{max(t) * 1e3:.1f}"
            print(f"  {name:7s} {med[name] * 1e3:8.1f} ms/step (rounds {spread})")
        print(f"  gloo / pycoll: {med['gloo'] / med['pycoll']:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
