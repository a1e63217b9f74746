"""``pycoll sim train``: a training step on many workers, its gradients reduced FIFO or scheduled by
priority in partitions (ByteScheduler), against the ideal bound.

The model (ByteScheduler's, as :mod:`pycoll.scheduling` runs it): each step runs the forward pass
layer by layer, a layer waiting only for its own parameters' reduced gradients of the previous
step, then the backward pass from the last layer, each layer's gradient ready for communication as
its backward ends. Communication is one stream that reduces one message at a time, or with a
``credit`` as many as fit in its bytes (their fixed costs overlapping, their transfers sharing the
links: see :func:`stream`): ``fifo`` sends each gradient whole in the order produced; ``priority``
cuts gradients into ``partition``-byte parts and always sends next the ready part of the layer
nearest the input.
A message's time is that of the collective that reduces it, simulated on the machine with the
real algorithm's programs (:func:`pycoll.sim.engine.run`, one simulation per distinct size), or
of BytePS's push-sum-pull through summation servers (:func:`push_pull_programs`). The
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


def push_pull_programs(workers: int, servers: int, nbytes: int) -> List[engine.Compact]:
    """BytePS's push-sum-pull of ``nbytes`` as programs: ranks ``0..workers-1`` are workers, the
    next ``servers`` ranks the summation servers. Each worker pushes a part of the tensor to every
    server (the parts as even as bytes allow) and pulls the sums back (its receives posted at
    once); each server receives a worker's part from every worker, sums them as they come, and
    sends the sum back to every worker."""
    parts = [nbytes // servers + (1 if k < nbytes % servers else 0) for k in range(servers)]
    progs = []
    for _ in range(workers):
        kinds = [engine.SEND] * servers + [engine.RECV] * servers
        peers = [workers + k for k in range(servers)] * 2
        progs.append(engine.Compact.build(kinds, peers, [0] * servers + [1] * servers, parts * 2,
                                          [[] for _ in kinds]))
    for k in range(servers):
        kinds = [engine.RECV] * workers
        deps: List[List[int]] = [[] for _ in range(workers)]
        last = 0
        for w in range(1, workers):  # (each worker's part summed into the running sum as it comes)
            kinds.append(engine.REDUCE)
            deps.append([last, w])
            last = len(kinds) - 1
        for _ in range(workers):
            kinds.append(engine.SEND)
            deps.append([last])
        n = len(kinds)
        peers = list(range(workers)) + [-1] * (workers - 1) + list(range(workers))
        steps = [0] * (n - workers) + [1] * workers
        progs.append(engine.Compact.build(kinds, peers, steps, [parts[k]] * n, deps))
    return progs


def push_pull_time(machine: Machine, workers: int, servers: int) -> Callable[[int], float]:
    """The simulated time of a push-sum-pull of ``n`` bytes on ``workers`` workers and ``servers``
    servers of ``machine`` (:func:`push_pull_programs`; each size simulated once)."""
    cache: Dict[int, float] = {}

    def time_of(nbytes: int) -> float:
        if nbytes not in cache:
            cache[nbytes] = engine.run(push_pull_programs(workers, servers, nbytes), machine).time
        return cache[nbytes]
    return time_of


def stream(jobs: List[Tuple[float, int, int]], comm: Callable[[int], float], by_priority: bool,
           free: float, credit: int = 0) -> List[float]:
    """The communication stream from time ``free``: ``jobs`` are (ready, layer, bytes); next the
    ready one of the lowest layer (``by_priority``) or the earliest ready. Returns when each job is
    done, in the order given.

    ``credit`` (bytes; 0: one message at a time): as many messages in flight as their bytes fit
    (at least one), as ByteScheduler's credit allows. Messages in flight share the links: a
    message's time ``comm(n)`` is its latency ``comm(1)`` (its steps' fixed costs, which overlap
    with other messages') and the rest, its transfer, which waits for the transfers before it;
    so a message started at ``s`` is done at ``max(s, links free) + transfer + latency``."""
    order = sorted(range(len(jobs)), key=lambda j: jobs[j][0])
    done = [0.0] * len(jobs)
    ready: List[Tuple[float, float, int]] = []
    flight: List[Tuple[float, int]] = []  # (done, bytes) of the messages in flight
    latency = comm(1) if credit else 0.0
    t, k, held, links = free, 0, 0, free
    while k < len(order) or ready:
        while k < len(order) and jobs[order[k]][0] <= t:  # what is ready by now, by priority
            j = order[k]
            heapq.heappush(ready, ((jobs[j][1] if by_priority else jobs[j][0]), jobs[j][0], j))
            k += 1
        if ready and (not flight or held + jobs[ready[0][2]][2] <= credit):  # start the next one now
            _, _, j = heapq.heappop(ready)
            nbytes = jobs[j][2]
            links = max(t, links) + comm(nbytes) - latency
            done[j] = links + latency
            heapq.heappush(flight, (done[j], nbytes))
            held += nbytes
            continue
        # else wait: for the next message in flight to end (its credit back), or the next job
        arrives = jobs[order[k]][0] if k < len(order) else float("inf")
        if flight and flight[0][0] <= arrives:
            end, nbytes = heapq.heappop(flight)
            held -= nbytes
            t = max(t, end)
        else:
            t = arrives
    return done


def step_time(layers: List[Layer], comm: Callable[[int], float], policy: str, partition: int = 0,
              steps: int = 6, credit: int = 0) -> float:
    """The steady step time of ``layers`` under ``policy`` (``fifo``: whole gradients in the
    order produced; ``priority``: parts of ``partition`` bytes, the layer nearest the input first),
    with ``credit`` bytes in flight (0: one message at a time; see :func:`stream`)."""
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
        done = stream(jobs, comm, policy == "priority", stream_free, credit)
        stream_free = max(done)
        reduced = [0.0] * n
        for (_, i, _), d in zip(jobs, done):
            reduced[i] = max(reduced[i], d)
    return starts[-1] - starts[-2]


def ideal(layers: List[Layer], comm: Callable[[int], float], partition: int = 0, credit: int = 0) -> float:
    """The larger of a step's compute and its communication (parts of ``partition`` bytes; with
    ``credit``, their latencies overlap but one, as in :func:`stream`)."""
    compute = sum(layer.forward + layer.backward for layer in layers)
    latency = comm(1) if credit else 0.0
    talk = latency
    for layer in layers:
        part = partition or layer.nbytes
        whole, rest = divmod(layer.nbytes, part)
        talk += whole * (comm(part) - latency) + ((comm(rest) - latency) if rest else 0.0)
    return max(compute, talk)
