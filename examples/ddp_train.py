"""Data-parallel training over pycoll: PyTorch DDP on the ``pycoll`` torch.distributed backend.

Each rank fits the same small MLP to its own shard of a synthetic regression task; DDP averages the
gradients through pycoll after every backward pass, so the replicas stay identical. Rank 0 prints
the loss averaged over the ranks. ``--priority-hook`` lets pycoll schedule the gradient buckets
(the layers nearest the input first, large buckets split into parts; see ``pycoll.torch.hooks``).
``--scheduled`` trains without DDP and without its global barrier: ``pycoll.torch.ScheduledOptimizer``
posts each gradient as backward makes it and updates each parameter as soon as it is reduced.

    torchrun --nproc-per-node 2 examples/ddp_train.py
    torchrun --nproc-per-node 2 examples/ddp_train.py --priority-hook --steps 300
    torchrun --nproc-per-node 2 examples/ddp_train.py --scheduled
    pycoll run -n 2 -- python examples/ddp_train.py

Surviving a failure with torchrun's restarts: ``--checkpoint DIR`` saves the model, the optimizer
and every rank's sampling state every ``--checkpoint-every`` steps and resumes from the last one
when started again; ``--kill-at STEP`` SIGKILLs rank 1 at that step of the first attempt. The
other rank's collective fails within about 50 ms (``pycoll.PeerLostError``), torchrun restarts the
job and it finishes from the checkpoint with exactly the parameters of an uninterrupted run::

    torchrun --nproc-per-node 2 --max-restarts 1 examples/ddp_train.py --steps 60 \
        --checkpoint /tmp/ckpt --kill-at 35
"""

from __future__ import annotations

import argparse
import os
import signal
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import pycoll.torch  # noqa: F401 - registers the "pycoll" backend (and reads pycoll run's rank variables)
from pycoll.torch import PriorityHookState, ScheduledOptimizer, priority_hook


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step (default 64)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--log-every", type=int, default=20, help="print the loss every N steps (default 20)")
    p.add_argument("--priority-hook", action="store_true", help="schedule buckets by pycoll's priority hook")
    p.add_argument("--scheduled", action="store_true",
                   help="no DDP: pycoll.torch.ScheduledOptimizer (per-parameter updates, no global barrier)")
    p.add_argument("--checkpoint", help="directory to save to every --checkpoint-every steps and resume from")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (default 10)")
    p.add_argument("--kill-at", type=int, help="SIGKILL rank 1 at this step of the first (torchrun) attempt")
    args = p.parse_args()
    if args.checkpoint and args.scheduled:
        p.error("--checkpoint goes with DDP (not --scheduled)")
    return args


def shard(rank: int, n: int = 2048, dim: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's samples of y = sin(x @ w) + noise (the same w on every rank)."""
    w = torch.randn(dim, 1, generator=torch.Generator().manual_seed(0)) / dim**0.5
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(n, dim, generator=g)
    return x, torch.sin(x @ w) + 0.05 * torch.randn(n, 1, generator=g)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("pycoll")  # under torchrun, pycoll run or mpiexec
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    mlp = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))
    if args.scheduled:  # gradients scheduled as they appear, each parameter updated when reduced
        model = mlp
        opt = ScheduledOptimizer(mlp, torch.optim.SGD(mlp.parameters(), lr=args.lr, momentum=0.9),
                                 partition_bytes="32K", credit_bytes="128K")
    else:
        model = DDP(mlp)
        if args.priority_hook:
            model.register_comm_hook(PriorityHookState(partition_bytes="32K", credit_bytes="128K"),
                                     priority_hook)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    x, y = shard(rank)
    pick = torch.Generator().manual_seed(100 + rank)
    start = resume(args.checkpoint, rank, mlp, opt, pick) if args.checkpoint else 0
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

    for step in range(start + 1, args.steps + 1):
        if step == args.kill_at and rank == 1 and first_attempt:
            print(f"rank 1: killed at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        idx = torch.randint(len(x), (args.batch,), generator=pick)
        loss = nn.functional.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()  # DDP allreduces the gradients through pycoll here
        opt.step()
        if step % args.log_every == 0 or step == args.steps:
            mean = loss.detach().clone()
            dist.all_reduce(mean)  # a plain collective on the same backend
            if rank == 0:
                print(f"step {step:4d}  loss {mean.item() / world:.4f}", flush=True)
        if args.checkpoint and step % args.checkpoint_every == 0:
            save(args.checkpoint, step, rank, mlp, opt, pick)

    if args.scheduled:
        opt.synchronize()  # the last step's updates
    if rank == 0:  # (every replica holds the same parameters)
        flat = torch.cat([p.detach().reshape(-1) for p in mlp.parameters()])
        print(f"parameters crc32 {zlib.crc32(flat.numpy().tobytes()):08x}", flush=True)
    dist.destroy_process_group()


def save(directory: str, step: int, rank: int, model: nn.Module, opt: torch.optim.Optimizer,
         pick: torch.Generator) -> None:
    """The checkpoint of ``step``: rank 0 writes the model and the optimizer, each rank its sampling
    state; a file is renamed into place when whole, and ``latest`` names the step once all are."""
    os.makedirs(directory, exist_ok=True)

    def put(obj: object, name: str) -> None:
        torch.save(obj, os.path.join(directory, name + ".tmp"))
        os.replace(os.path.join(directory, name + ".tmp"), os.path.join(directory, name))

    if rank == 0:
        put({"model": model.state_dict(), "opt": opt.state_dict()}, f"state{step}.pt")
    put(pick.get_state(), f"pick{step}.rank{rank}.pt")
    dist.barrier()  # every file of this step is in place
    if rank == 0:
        put(step, "latest")


def resume(directory: str, rank: int, model: nn.Module, opt: torch.optim.Optimizer,
           pick: torch.Generator) -> int:
    """Load the last whole checkpoint, if any: the step it was taken after (0: none)."""
    latest = os.path.join(directory, "latest")
    if not os.path.exists(latest):
        return 0
    step = torch.load(latest)
    state = torch.load(os.path.join(directory, f"state{step}.pt"))
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    pick.set_state(torch.load(os.path.join(directory, f"pick{step}.rank{rank}.pt")))
    if rank == 0:
        print(f"resumed from the checkpoint of step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
