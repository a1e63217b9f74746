"""Links shared among the messages crossing them: a fluid model with max-min fair rates.

A message in flight is a flow over a few links (its sender's NIC out, its receiver's NIC in, the
uplinks of a fat tree's leaf switches: :meth:`pycoll.sim.machine.Machine.route`). Every flow gets
the max-min fair rate: the links are filled progressively, the most constrained first (its
capacity shared equally among the flows still unfixed that cross it), each flow's rate fixed at
the share of its tightest link. Rates are recomputed whenever a flow starts or ends, all the
changes of one instant together (:meth:`Flows.settle`); between two changes each flow drains at
its rate, and its end is projected from the bytes it has left.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Dict, Hashable, List, Sequence, Set, Tuple

Link = Hashable


def max_min_rates(routes: Dict[int, Sequence[Link]], capacity: Callable[[Link], float]) -> Dict[int, float]:
    """The max-min fair rate of each flow (flow id -> the links it crosses), by progressive
    filling: repeatedly the link whose remaining capacity per unfixed flow is the smallest fixes
    its flows at that share, which the other links they cross then lose."""
    users: Dict[Link, Set[int]] = {}
    for fid, links in routes.items():
        for link in links:
            users.setdefault(link, set()).add(fid)
    left = {link: capacity(link) for link in users}
    heap = [(left[link] / len(u), link_no, link) for link_no, (link, u) in enumerate(users.items())]
    heapq.heapify(heap)
    rates: Dict[int, float] = {}
    stamp = len(heap)
    while heap:
        share, _, link = heapq.heappop(heap)
        u = users[link]
        if not u or share != left[link] / len(u):
            continue  # (an outdated entry: the link lost flows or capacity since)
        touched = set()
        for fid in list(u):
            rates[fid] = share
            for other in routes[fid]:
                users[other].discard(fid)
                left[other] = max(0.0, left[other] - share) if not math.isinf(share) else left[other]
                touched.add(other)
        for other in touched:
            if users[other]:
                stamp += 1
                heapq.heappush(heap, (left[other] / len(users[other]), stamp, other))
    for fid in routes:
        if fid not in rates:  # (crosses no link: nothing limits it)
            rates[fid] = math.inf
    return rates


class Flows:
    """The messages in flight and their rates; times in seconds, sizes in bytes. ``capacity``
    gives each link's bandwidth (bytes per second)."""

    def __init__(self, capacity: Callable[[Link], float]) -> None:
        self.capacity = capacity
        self.now = 0.0
        self.dirty = False  # flows started or ended at ``now`` since the rates were computed
        self._left: Dict[int, float] = {}
        self._rate: Dict[int, float] = {}
        self._routes: Dict[int, Tuple[Link, ...]] = {}

    def __len__(self) -> int:
        return len(self._left)

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for fid, rate in self._rate.items():
                self._left[fid] -= rate * dt if not math.isinf(rate) else self._left[fid]
        self.now = max(self.now, t)

    def start(self, t: float, fid: int, nbytes: float, route: Sequence[Link]) -> None:
        """Flow ``fid`` of ``nbytes`` starts at ``t`` over the links of ``route``."""
        self._advance(t)
        self._left[fid] = float(nbytes)
        self._rate[fid] = 0.0
        self._routes[fid] = tuple(route)
        self.dirty = True

    def end(self, t: float, fid: int) -> None:
        """Flow ``fid`` is done at ``t`` (its projected end): its links go to the others."""
        self._advance(t)
        del self._left[fid], self._rate[fid], self._routes[fid]
        self.dirty = True

    def settle(self) -> List[Tuple[float, int]]:
        """Recompute the rates at ``now``; (projected end, flow id) of every flow in flight (an
        earlier projection of a flow is outdated by the new one)."""
        self.dirty = False
        self._rate = max_min_rates(self._routes, self.capacity)
        ends = []
        for fid, rate in self._rate.items():
            left = max(0.0, self._left[fid])
            ends.append((self.now + (left / rate if rate > 0 and left > 0 else 0.0), fid))
        return ends

    def rate(self, fid: int) -> float:
        """Flow ``fid``'s current rate (bytes per second)."""
        return self._rate[fid]
