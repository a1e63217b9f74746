"""ByteScheduler-style scheduling against FIFO and DDP-style buckets, under a bandwidth limit.

Communication-bound training is reproduced on one machine with ``PYCOLL_BW_LIMIT`` (each rank's
sends pass a token bucket, so a message of n bytes arrives about n/limit seconds after it is sent)
and compute emulated by timed sleeps, while the engine's progress thread moves the data::

    PYCOLL_BW_LIMIT=100M mpiexec -n 2 python benchmarks/scheduling.py contrived [--unit 0.1]
    PYCOLL_BW_LIMIT=1G mpiexec -n 2 python benchmarks/scheduling.py vgg16 [--compute 0.5] [--steps 5]
    PYCOLL_BW_LIMIT=1G mpiexec -n 2 python benchmarks/scheduling.py tuning [--steps 60]

Every step runs the forward pass layer by layer, each layer waiting only for its own parameters'
reduced gradients of the previous step (no global barrier), then the backward pass from the last
layer, each layer's gradients handed to communication as they are produced:

* ``fifo``: each gradient whole, one collective at a time in the order produced, as on one
  communication stream (Horovod's background thread, an NCCL stream);
* ``bucket``: gradients packed in reverse order into DDP's buckets (first 1 MiB, then 25 MiB),
  each bucket reduced when full, one at a time in order (DDP's single stream);
* ``sched``: pycoll.scheduling: priority = layer index from the input, partitions, credit.

The variants take turns (``--rounds``) so that they see the same machine load; a variant's step time
is the slowest rank's median over its steps after the first. ``contrived`` is the example of
ByteScheduler's "communication scheduling" note rebuilt (see ``contrived()``); ``vgg16`` uses
VGG16's 32 parameter tensors at their real sizes (138 M float32 parameters) with compute per layer
proportional to its FLOPs; ``tuning`` lets the auto-tuner pick credit and partition and compares
what it reaches with a manual grid.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
from mpi4py import MPI

from pycoll import Team, config, trace
from pycoll.scheduling import AutoTuner, Scheduler
from pycoll.sim.training import VGG16

FIRST_BUCKET = 1 << 20  # DDP's first bucket
BUCKET = 25 << 20  # DDP's bucket_cap_mb=25


@dataclass
class Layer:
    name: str
    tensors: List[tuple]  # (name, float32 count)
    fwd: float  # seconds
    bwd: float
    grads: Dict[str, np.ndarray] = field(default_factory=dict)


def contrived(unit_s: float, limit: int) -> List[Layer]:
    """Three layers, forward and backward 1 unit of compute each; gradients of 1, 1 and 3 units
    of communication (the layer nearest the output is the large one, as in VGG's classifier).

    FIFO: the large gradient, produced first, holds the link while the small urgent ones wait:
    the next forward starts 9 units after the last one. Priority with partitions of 1 unit: one
    part of it goes, then layer 1's and layer 0's gradients jump ahead; the forward starts
    after 7 units and the rest of the large gradient overlaps layers 0-1's forward: 7 units a
    step, 9/7 = 1.29x (the note's example, with push and pull, reports 1.44x)."""
    unit = int(unit_s * limit) // 4  # float32 count that takes one unit on the link
    return [Layer(f"l{i}", [(f"l{i}.w", units * unit)], unit_s, unit_s) for i, units in enumerate((1, 1, 3))]


_VGG = VGG16  # (name, out channels or features, in, spatial size) per layer: pycoll.sim.training's


def vgg16(forward_s: float, backward: float = 2.0) -> List[Layer]:
    """VGG16's 16 layers: weight and bias tensors at their real sizes (32 tensors, 138.4 M
    parameters); forward compute per layer proportional to its multiply-adds (``forward_s`` in
    all), backward ``backward`` times the forward."""
    macs, layers = [], []
    for name, out, inp, hw in _VGG:
        k = 9 if name.startswith("conv") else 1
        macs.append(out * inp * k * hw * hw)
        layers.append(Layer(name, [(f"{name}.weight", out * inp * k), (f"{name}.bias", out)], 0.0, 0.0))
    total = sum(macs)
    for layer, m in zip(layers, macs):
        layer.fwd = forward_s * m / total
        layer.bwd = backward * layer.fwd
    return layers


class Run:
    """One variant's steps on a team."""

    def __init__(self, team: Team, layers: List[Layer], mode: str, partition: int, credit: int,
                 tuner: Optional[AutoTuner] = None) -> None:
        self.team, self.layers, self.mode = team, layers, mode
        if mode == "sched":
            self.sched = Scheduler(team, partition_bytes=partition, credit_bytes=credit,
                                   tuning=tuner or "off", background=True, timeout=600)
        else:  # whole tensors one at a time (one communication stream), by arrival: FIFO
            self.sched = Scheduler(team, partition_bytes=0, credit_bytes=1, tuning="off", background=True,
                                   timeout=600)
        for layer in layers:
            layer.grads = {t: np.ones(n, np.float32) for t, n in layer.tensors}
        self.waits: List[list] = [[] for _ in layers]
        self.arrival = 0
        self.bucket: List[int] = []  # layers whose gradients are in the open bucket
        self.bucket_bytes = 0
        self.buckets = 0
        self.bucket_bufs: Dict[int, np.ndarray] = {}

    def step(self) -> None:
        tracer = trace.tracer()  # with PYCOLL_TRACE: forward and backward spans for the plot
        t0 = time.monotonic()
        for i, layer in enumerate(self.layers):  # forward: each layer waits for its own gradients only
            for h in self.waits[i]:
                h.wait()
            self.waits[i] = []
            time.sleep(layer.fwd)
        t1 = time.monotonic()
        for i in reversed(range(len(self.layers))):  # backward from the output
            layer = self.layers[i]
            time.sleep(layer.bwd)
            self.ready(i, layer)
        if tracer is not None:
            tracer.complete(f"forward ({self.mode})", "forward", t0, t1)
            tracer.complete(f"backward ({self.mode})", "backward", t1, time.monotonic())
        self.sched.step()

    def ready(self, i: int, layer: Layer) -> None:
        sched = self.sched
        if self.mode == "sched":
            for t, g in layer.grads.items():
                self.waits[i].append(sched.submit(t, g, priority=i))
        elif self.mode == "fifo":
            for t, g in layer.grads.items():
                self.waits[i].append(sched.submit(t, g, priority=self.arrival))
                self.arrival += 1
        else:  # bucket: DDP packs gradients in reverse order, reduces a bucket once it is full
            self.bucket.append(i)
            self.bucket_bytes += sum(g.nbytes for g in layer.grads.values())
            cap = FIRST_BUCKET if self.buckets == 0 else BUCKET
            if self.bucket_bytes >= cap or i == 0:
                buf = self.bucket_bufs.get(self.buckets)
                if buf is None:  # DDP's buckets are allocated once
                    buf = self.bucket_bufs[self.buckets] = np.ones(self.bucket_bytes // 4, np.float32)
                h = sched.submit(f"bucket{self.buckets}", buf, priority=self.arrival)
                self.arrival += 1
                for j in self.bucket:
                    self.waits[j].append(h)
                self.buckets += 1
                self.bucket, self.bucket_bytes = [], 0
        if i == 0:
            self.buckets = 0

    def finish(self) -> None:
        for hs in self.waits:
            for h in hs:
                h.wait()
        self.waits = [[] for _ in self.layers]


def measure(team: Team, comm: MPI.Comm, layers: List[Layer], variants: Dict[str, tuple], steps: int,
            rounds: int) -> Dict[str, float]:
    """Median seconds per step of each variant (slowest rank), variants taking turns."""
    times: Dict[str, List[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for name, (mode, partition, credit) in variants.items():
            run = Run(team, layers, mode, partition, credit)
            comm.Barrier()
            starts = []
            for _ in range(steps + 1):
                starts.append(time.perf_counter())
                run.step()
            starts.append(time.perf_counter())
            run.finish()
            per = np.diff(starts)[1:]  # the first step has no gradients to wait for
            times[name].extend(per.tolist())
    return {v: comm.allreduce(statistics.median(ts), op=MPI.MAX) for v, ts in times.items()}


def report(comm: MPI.Comm, title: str, result: Dict[str, float], base: str = "fifo") -> None:
    if comm.rank:
        return
    print(f"\n{title}")
    print(f"{'variant':<24}{'step ms':>10}{'x ' + base:>10}")
    for name, t in result.items():
        print(f"{name:<24}{t * 1e3:>10.1f}{t / result[base]:>10.2f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["contrived", "vgg16", "tuning"])
    p.add_argument("--unit", type=float, default=0.1, help="contrived: seconds per unit")
    p.add_argument("--parts", type=int, default=4, help="contrived: partitions per unit (credit: one)")
    p.add_argument("--compute", type=float, default=0.5, help="vgg16/tuning: forward seconds (backward 2x)")
    p.add_argument("--backward", type=float, default=2.0, help="vgg16/tuning: backward / forward compute")
    p.add_argument("--partition", default="4M")
    p.add_argument("--credit", default="8M")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    limit = config.get("PYCOLL_BW_LIMIT")
    if not limit:
        raise SystemExit("set PYCOLL_BW_LIMIT (bytes/s per rank), e.g. PYCOLL_BW_LIMIT=1G")
    team = Team.from_mpi(comm)
    head = (f"{comm.size} ranks, PYCOLL_BW_LIMIT={limit / 1e6:.0f} MB/s per rank, "
            f"PYCOLL_TLS={config.get('PYCOLL_TLS')}")
    if args.what == "contrived":
        layers = contrived(args.unit, limit)
        unit = layers[0].tensors[0][1] * 4
        part = unit // args.parts
        variants = {"fifo": ("fifo", 0, 0), f"sched (partition 1/{args.parts} unit)": ("sched", part, part)}
        result = measure(team, comm, layers, variants, args.steps, args.rounds)
        report(comm, f"contrived example, unit {args.unit * 1e3:.0f} ms = {unit >> 10} KiB; {head}; "
               "ideal: fifo 9 units, sched 7 units (0.78x)", result)
    elif args.what == "vgg16":
        layers = vgg16(args.compute, args.backward)
        part, credit = config.parse_bytes(args.partition), config.parse_bytes(args.credit)
        variants = {"fifo": ("fifo", 0, 0), "bucket (DDP 25 MB)": ("bucket", 0, 0),
                    f"sched p={args.partition} c={args.credit}": ("sched", part, credit)}
        result = measure(team, comm, layers, variants, args.steps, args.rounds)
        report(comm, f"VGG16 (138.4 M params), forward {args.compute:.2f} s + backward "
               f"{args.backward * args.compute:.2f} s; {head}", result)
    else:
        tuning(team, comm, args, head)


def tuning(team: Team, comm: MPI.Comm, args: argparse.Namespace, head: str) -> None:
    """The auto-tuner (credit and partition) from a poor start vs a manual grid."""
    layers = vgg16(args.compute, args.backward)
    grid = {}
    for part in ("1M", "4M", "16M"):
        for mult in (1, 2, 4):
            pb = config.parse_bytes(part)
            grid[f"p={part} c={mult}x"] = ("sched", pb, mult * pb)
    manual = measure(team, comm, layers, grid, 3, 1)
    best = min(manual, key=manual.get)
    tuner = AutoTuner(credit=True, partition=True, trials=10, trial_steps=2, warmup_steps=1,
                      credit_range=(1 << 20, 64 << 20), partition_range=(1 << 20, 32 << 20))
    run = Run(team, layers, "sched", 64 << 20, 64 << 20, tuner=tuner)  # a poor start: no partitions
    comm.Barrier()
    t0 = time.perf_counter()
    starts, tuned_at = [], None
    for step in range(args.steps):
        starts.append(time.perf_counter())
        run.step()
        if tuned_at is None and comm.bcast(tuner.state == "tuned" if comm.rank == 0 else None, root=0):
            tuned_at = (step + 1, time.perf_counter() - t0)
    starts.append(time.perf_counter())
    run.finish()
    per = np.diff(starts)
    last = comm.allreduce(statistics.median(per[-8:]), op=MPI.MAX)
    first = comm.allreduce(statistics.median(per[1:4]), op=MPI.MAX)
    if comm.rank == 0:
        print(f"\nauto-tuning (credit + partition), VGG16, forward {args.compute:.2f} s; {head}")
        for name, t in manual.items():
            print(f"  manual {name:<16}{t * 1e3:>9.1f} ms")
        print(f"  best manual: {best} {manual[best] * 1e3:.1f} ms")
        print(f"  tuner start (p=64M c=64M): {first * 1e3:.1f} ms")
        if tuned_at:
            print(f"  tuned after {tuned_at[0]} steps ({tuned_at[1]:.1f} s): best trial {tuner.best}")
        print(f"  tuned step time (median of last 8): {last * 1e3:.1f} ms = "
              f"{last / manual[best]:.2f}x best manual")
        for entry in tuner.log:
            print("   ", entry)


if __name__ == "__main__":
    main()
