"""Closed forms of the alpha-beta-gamma model (Thakur, Rabenseifner and Gropp, 2005; Chan et al.,
2007), for ``p`` ranks, ``n`` bytes, latency ``a``, seconds per byte ``b`` and reduction seconds
per byte ``c``: what the simulator must reproduce on a flat machine with free copies.

The scatter-allgather bcast is given as pycoll runs it: its binomial scatter overlaps the ring
allgather (a rank starts passing blocks on as soon as it has its own), so its latency term is
``(p - 1) a`` rather than the textbook's ``(log p + p - 1) a``.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Tuple

from pycoll.sim.machine import Machine

Formula = Callable[[int, float, float, float, float], float]


def _lg(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


#: (collective, algorithm) -> time(p, n, a, b, c); ``n`` is the call's size as ``pycoll perf`` counts it.
FORMULAS: Dict[Tuple[str, str], Formula] = {
    ("allreduce", "rd"): lambda p, n, a, b, c: _lg(p) * (a + n * b + n * c),
    ("allreduce", "ring"):
        lambda p, n, a, b, c: 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * c,
    ("allreduce", "rabenseifner"):
        lambda p, n, a, b, c: 2 * _lg(p) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * c,
    ("bcast", "knomial"): lambda p, n, a, b, c: _lg(p) * (a + n * b),
    ("bcast", "scatter_allgather"): lambda p, n, a, b, c: (p - 1) * a + 2 * (p - 1) / p * n * b,
    ("allgather", "ring"): lambda p, n, a, b, c: (p - 1) * (a + n / p * b),
    ("allgather", "rd"): lambda p, n, a, b, c: _lg(p) * a + (p - 1) / p * n * b,
    ("reduce_scatter", "ring"): lambda p, n, a, b, c: (p - 1) * (a + n / p * (b + c)),
    ("reduce_scatter", "rhalving"): lambda p, n, a, b, c: _lg(p) * a + (p - 1) / p * n * (b + c),
}


def predicted(coll: str, algorithm: str, p: int, nbytes: int, machine: Machine) -> float:
    """The closed form's time on ``machine``'s network (its node level ignored), or nan."""
    f = FORMULAS.get((coll, algorithm))
    if f is None:
        return math.nan
    return f(p, nbytes, machine.alpha, 1.0 / machine.bandwidth, 1.0 / machine.reduce_bw)
