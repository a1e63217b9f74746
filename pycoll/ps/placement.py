"""Where each partition of a push-pull tensor is summed: BytePS's optimal load split.

With n workers (each hosting a colocated summation service) and k CPU-only summation servers,
BytePS (OSDI'20, section 4.1) gives each server ``M_cpu = 2(n-1)M / (n^2+kn-2k)`` bytes of a model
of M bytes and each colocated service ``M_gpu = (n-k)M / (n^2+kn-2k)``, which balances the
communication time of both kinds of machine (k = 0 is all-reduce, k = n a plain parameter server).
Keys are placed through ``L = n^2+kn-2k`` slots: each server owns ``2(n-1)`` slots, each colocated
service ``n-k``, interleaved (smooth weighted round-robin) so that consecutive parts go to
different services. Part ``j`` of a tensor goes to slot ``(h(name) + j) mod L``: every
rank computes the same place from the name alone (no coordination), tensors start at different
slots, and a tensor of at least ``L`` parts is cut into a multiple of ``L`` equal parts so that
every service gets exactly its share. With ``k > n`` (more servers than BytePS can use) or a single
worker the servers share the keys evenly.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from typing import List, Tuple

#: Partitions smaller than this are not cut further to reach a multiple of the slot count.
MIN_PART_BYTES = 64 << 10


def slots(n: int, k: int) -> Tuple[int, int, int]:
    """(L, slots per server, slots per colocated service) for n workers and k servers."""
    if n < 1 or k < 0:
        raise ValueError(f"push_pull needs n >= 1 workers and k >= 0 servers, got n={n}, k={k}")
    if k and (k >= n or n == 1):  # the colocated services would get nothing: servers share evenly
        return k, 1, 0
    return n * n + k * n - 2 * k, 2 * (n - 1), n - k


def shares(n: int, k: int) -> Tuple[float, float]:
    """(fraction of the model on each server, on each colocated service)."""
    total, per_server, per_worker = slots(n, k)
    return per_server / total, per_worker / total


@dataclass(frozen=True)
class Service:
    """A summation service: ``server`` True for a CPU-only server (index among servers), else the
    colocated service of worker ``index``."""

    server: bool
    index: int


@functools.lru_cache(maxsize=64)
def slot_table(n: int, k: int) -> Tuple[Service, ...]:
    """The service of every slot: each server ``2(n-1)`` slots, each colocated service ``n-k``,
    interleaved by smooth weighted round-robin so that a tensor's consecutive parts alternate
    between services (consecutive runs per service would send all of a server's parts last,
    and it would start answering pulls late)."""
    total, per_server, per_worker = slots(n, k)
    services = [(Service(True, i), per_server) for i in range(k)]
    services += [(Service(False, i), per_worker) for i in range(n) if per_worker]
    current = [0] * len(services)
    table = []
    for _ in range(total):
        for i, (_, weight) in enumerate(services):
            current[i] += weight
        best = max(range(len(services)), key=lambda i: (current[i], -i))
        current[best] -= total
        table.append(services[best][0])
    return tuple(table)


def service_of_slot(slot: int, n: int, k: int) -> Service:
    return slot_table(n, k)[slot]


def name_hash(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Part:
    key: int  # index of the part in the tensor
    lo: int  # first element
    hi: int  # one past the last element
    service: Service


def plan(name: str, count: int, itemsize: int, n: int, k: int, partition_bytes: int) -> List[Part]:
    """The parts of tensor ``name`` (``count`` elements) and the service that sums each."""
    total_slots = slots(n, k)[0]
    if count == 0:
        return []
    nbytes = count * itemsize
    pb = partition_bytes if partition_bytes > 0 else nbytes
    parts = max(1, math.ceil(nbytes / pb))
    if nbytes >= total_slots * MIN_PART_BYTES:  # exact shares: a multiple of L equal parts
        parts = total_slots * math.ceil(parts / total_slots)
    parts = min(parts, count)
    base = name_hash(name) % total_slots
    out = []
    for j in range(parts):
        lo, hi = count * j // parts, count * (j + 1) // parts
        out.append(Part(j, lo, hi, service_of_slot((base + j) % total_slots, n, k)))
    return out
