"""Collective algorithms: one file each, registered here by collective and name.

``ALGORITHMS[coll][name]`` is ``build(args) -> Task``. :func:`select` picks one when the caller
does not force it with ``algorithm=``.
"""

from __future__ import annotations

from typing import Callable, Dict

from pycoll.algorithms import (
    allreduce_knomial,
    allreduce_rd,
    allreduce_ring,
    barrier_dissemination,
    bcast_knomial,
)
from pycoll.algorithms.base import CollArgs
from pycoll.tasks.task import Task

Builder = Callable[[CollArgs], Task]


def _shm(module: str) -> Builder:
    """The builder of a shared-memory algorithm, imported when first used (it needs the native
    module, which a pure-Python checkout may lack)."""
    def build(args: CollArgs) -> Task:
        import importlib

        return importlib.import_module(f"pycoll.algorithms.{module}").build(args)
    return build


ALGORITHMS: Dict[str, Dict[str, Builder]] = {
    "allreduce": {
        "rd": allreduce_rd.build,
        "ring": allreduce_ring.build,
        "knomial": allreduce_knomial.build,
        "shm": _shm("allreduce_shm"),
    },
    "bcast": {
        "knomial": bcast_knomial.build,
        "shm": _shm("bcast_shm"),
    },
    "barrier": {
        "dissemination": barrier_dissemination.build,
        "shm": _shm("barrier_shm"),
    },
}

#: Collectives with a shared-memory algorithm, used when all ranks share a host (untagged calls).
SHM_ALGORITHMS = {"allreduce": "shm", "bcast": "shm", "barrier": "shm"}

#: From this many bytes allreduce uses the ring (bandwidth-bound) instead of recursive doubling
#: (latency-bound). Two ranks: measured with `pycoll perf allreduce -n 2 --algorithm rd|ring` on
#: the 2-core development machine (MPI transport), where one full exchange beats the ring's two
#: half exchanges up to 8 MiB. More ranks: the ring moves 2(n-1)/n of the buffer instead of
#: log2(n) whole buffers, so it takes over much earlier (MPICH's default threshold).
ALLREDUCE_RING_MIN_BYTES = {2: 8 << 20}
ALLREDUCE_RING_MIN_BYTES_DEFAULT = 256 << 10


def select(coll: str, size: int, nbytes: int, shared: bool = False) -> str:
    """The default algorithm for a collective of ``nbytes`` on a team of ``size``; ``shared``:
    the team has a shared-memory segment (all ranks on one host) and the call may use it."""
    if shared and size > 1 and coll in SHM_ALGORITHMS:
        return SHM_ALGORITHMS[coll]
    if coll == "bcast":
        return "knomial"
    if coll == "barrier":
        return "dissemination"
    if coll == "allreduce":
        if size < 2:
            return "rd"
        threshold = ALLREDUCE_RING_MIN_BYTES.get(size, ALLREDUCE_RING_MIN_BYTES_DEFAULT)
        return "ring" if nbytes >= threshold else "rd"
    raise ValueError(f"unknown collective {coll!r}")


def get(coll: str, name: str) -> Builder:
    """The builder of algorithm ``name`` for ``coll``; ValueError naming the choices otherwise."""
    table = ALGORITHMS.get(coll)
    if table is None:
        raise ValueError(f"unknown collective {coll!r}; known: {', '.join(ALGORITHMS)}")
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {coll} algorithm {name!r}; known: {', '.join(table)}") from None
