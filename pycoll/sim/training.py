"""``pycoll sim train``: a training step on many workers, its gradients reduced FIFO or scheduled by
priority in partitions (ByteScheduler), against the ideal bound.

The model (ByteScheduler's, as :mod:`pycoll.scheduling` runs it): each step runs the forward pass
layer by layer, a layer waiting only for its own parameters' reduced gradients of the previous
step, then the backward pass from the last layer, each layer's gradient ready for communication as
its backward ends. Communication is one stream that reduces one message at a time (a credit of one
message): ``fifo`` sends each gradient whole in the order produced; ``priority`` cuts gradients
into ``partition``-byte parts and always sends next the ready part of the layer nearest the input.
A message's time is that of the collective that reduces it, simulated on the machine with the
real algorithm's programs (:func:`pycoll.sim.engine.run`, one simulation per distinct size). The
ideal bound is the larger of the compute and the communication of a step (both perfectly
overlapped). Steps are repeated until the step time settles.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

from pycoll.sim import engine
from pycoll.sim.machine import Machine
from pycoll.sim.programs import programs

#: VGG16 on ImageNet (224x224): (name, out channels or features, in, spatial size) per layer.
VGG16 = [("conv1_1", 64, 3, 224), ("conv1_2", 64, 64, 224),
         ("conv2_1", 128, 64, 112), ("conv2_2", 128, 128, 112),
         ("conv3_1", 256, 128, 56), ("conv3_2", 256, 256, 56), ("conv3_3", 256, 256, 56),
         ("conv4_1", 512, 256, 28), ("conv4_2", 512, 512, 28), ("conv4_3", 512, 512, 28),
         ("conv5_1", 512, 512, 14), ("conv5_2", 512, 512, 14), ("conv5_3", 512, 512, 14),
         ("fc6", 4096, 25088, 1), ("fc7", 4096, 4096, 1), ("fc8", 1000, 4096, 1)]


@dataclass
class Layer:
    """One layer: its gradient's bytes and its forward and backward compute (seconds)."""

    name: str
    nbytes: int
    forward: float
    backward: float


def vgg16(forward_s: float, backward: float = 2.0) -> List[Layer]:
    """VGG16's 16 layers, float32 weights and biases (138.4 M parameters); forward compute per layer
    proportional to its multiply-adds, ``forward_s`` in all, backward ``backward`` times it."""
    macs = [out * inp * (9 if name.startswith("conv") else 1) * hw * hw for name, out, inp, hw in VGG16]
    total = sum(macs)
    return [Layer(name, 4 * (out * inp * (9 if name.startswith("conv") else 1) + out),
                  forward_s * m / total, backward * forward_s * m / total)
            for (name, out, inp, hw), m in zip(VGG16, macs)]


def reduce_time(machine: Machine, ranks: int, algorithm: str = "ring") -> Callable[[int], float]:
    """The simulated time of an allreduce of ``n`` bytes by ``algorithm`` on ``ranks`` ranks of
    ``machine`` (each size simulated once)."""
    cache: Dict[int, float] = {}

    def time_of(nbytes: int) -> float:
        if nbytes not in cache:
            cache[nbytes] = engine.run(programs("allreduce", algorithm, ranks, nbytes), machine).time
        return cache[nbytes]
    return time_of


def stream(jobs: List[Tuple[float, int, int]], comm: Callable[[int], float], by_priority: bool,
           free: float) -> List[float]:
    """One communication stream from time ``free``: ``jobs`` are (ready, layer, bytes); one at a
    time, next the ready one of the lowest layer (``by_priority``) or the earliest ready. Returns
    when each job is done, in the order given."""
    order = sorted(range(len(jobs)), key=lambda j: jobs[j][0])
    done = [0.0] * len(jobs)
    ready: List[Tuple[float, float, int]] = []
    t, k = free, 0
    while k < len(order) or ready:
        while k < len(order) and jobs[order[k]][0] <= t:
            j = order[k]
            heapq.heappush(ready, ((jobs[j][1] if by_priority else jobs[j][0]), jobs[j][0], j))
            k += 1
        if not ready:
            t = jobs[order[k]][0]
            continue
        _, _, j = heapq.heappop(ready)
        t += comm(jobs[j][2])
        done[j] = t
    return done


def step_time(layers: List[Layer], comm: Callable[[int], float], policy: str, partition: int = 0,
              steps: int = 6) -> float:
    """The steady step time of ``layers`` under ``policy`` (``fifo``: whole gradients in the
    order produced; ``priority``: parts of ``partition`` bytes, the layer nearest the input first)."""
    n = len(layers)
    reduced = [0.0] * n  # when each layer's gradient of the previous step was reduced
    starts: List[float] = []
    t = 0.0
    stream_free = 0.0
    for _ in range(steps):
        starts.append(t)
        for i, layer in enumerate(layers):  # forward: each layer waits for its own gradient only
            t = max(t, reduced[i]) + layer.forward
        jobs: List[Tuple[float, int, int]] = []
        for i in reversed(range(n)):  # backward from the output: each gradient ready as it ends
            t += layers[i].backward
            size = layers[i].nbytes
            part = partition if policy == "priority" and partition else size
            for off in range(0, size, part):
                jobs.append((t, i, min(part, size - off)))
        done = stream(jobs, comm, policy == "priority", stream_free)
        stream_free = max(done)
        reduced = [0.0] * n
        for (_, i, _), d in zip(jobs, done):
            reduced[i] = max(reduced[i], d)
    return starts[-1] - starts[-2]


def ideal(layers: List[Layer], comm: Callable[[int], float], partition: int = 0) -> float:
    """The larger of a step's compute and its communication (parts of ``partition`` bytes)."""
    compute = sum(layer.forward + layer.backward for layer in layers)
    talk = 0.0
    for layer in layers:
        part = partition or layer.nbytes
        whole, rest = divmod(layer.nbytes, part)
        talk += whole * comm(part) + (comm(rest) if rest else 0.0)
    return max(compute, talk)
