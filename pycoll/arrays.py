"""``team.alloc``: arrays in memory every rank of a host's team maps.

The team's shared segment makes the memory (:mod:`pycoll.tl.shm.mapped`); an allreduce of such
arrays takes the ``mapped`` form (:mod:`pycoll.algorithms.shm.allreduce_mapped`), chosen by the
planner whenever both buffers lie in this memory. Off one host (no segment) ``alloc`` is
``np.empty``, so the same program runs everywhere.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Union

import numpy as np

#: The longest text :func:`exchange` keeps of each rank's value.
EXCHANGE_BYTES = 256


def alloc(team: Any, shape: Union[int, Sequence[int]], dtype: Any = np.float32) -> np.ndarray:
    """A new array of ``shape`` and ``dtype`` (uninitialized) in memory every rank of ``team``
    maps when its ranks share a host (a plain ``np.empty`` otherwise).

    Collective: every rank calls it with the same shape and dtype (else
    :class:`pycoll.MismatchError` on every rank). The memory lives as long as the array or a
    view of it does (pycoll keeps the arrays of its recent calls' plans)."""
    dt = np.dtype(dtype)
    if team.shared is None:
        return np.empty(shape, dt)
    return team.shared.allocate(shape, dt, lambda value: exchange(team, value))


def exchange(team: Any, value: bytes) -> List[bytes]:
    """Collective: every rank's ``value`` (a short text: the first :data:`EXCHANGE_BYTES` are
    kept), by rank, over the team's own allgather."""
    width = EXCHANGE_BYTES
    value = value[:width]
    mine = np.zeros(width + 2, np.uint8)
    mine[:2] = len(value) & 0xFF, len(value) >> 8
    mine[2:2 + len(value)] = np.frombuffer(value, np.uint8)
    out = np.empty((team.size, width + 2), np.uint8)
    team.allgather(mine, out.reshape(-1)).wait()
    return [bytes(row[2:2 + int(row[0]) + (int(row[1]) << 8)]) for row in out]
