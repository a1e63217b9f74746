"""Collective algorithms: one file each, registered here by collective and name.

``ALGORITHMS[coll][name]`` is ``build(args) -> Task``. :func:`select` picks one when the caller
does not force it with ``algorithm=``.
"""

from __future__ import annotations

from typing import Callable, Dict, List

from pycoll import config
from pycoll.algorithms import (
    allgather_ring,
    allreduce_knomial,
    allreduce_rd,
    allreduce_ring,
    alltoall_pairwise,
    barrier_dissemination,
    bcast_knomial,
    gather_linear,
    reduce_knomial,
    reduce_scatter_ring,
    scatter_linear,
    tuning,
)
from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.tuning import INF, Rule
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
    "reduce": {"knomial": reduce_knomial.build, "shm": _shm("reduce_shm")},
    "allgather": {"ring": allgather_ring.build, "shm": _shm("allgather_shm")},
    "reduce_scatter": {"ring": reduce_scatter_ring.build, "shm": _shm("reduce_scatter_shm")},
    "alltoall": {"pairwise": alltoall_pairwise.build},
    "gather": {"linear": gather_linear.build},
    "scatter": {"linear": scatter_linear.build},
    # the v-variants: blocks of any size (args.layout), so only algorithms that handle them
    "allgatherv": {"ring": allgather_ring.build, "shm": _shm("allgather_shm")},
    "reduce_scatterv": {"ring": reduce_scatter_ring.build, "shm": _shm("reduce_scatter_shm")},
    "alltoallv": {"pairwise": alltoall_pairwise.build},
    "gatherv": {"linear": gather_linear.build},
    "scatterv": {"linear": scatter_linear.build},
}



#: The default selection table. Measured on the 2-core development VM with
#: `pycoll perf allreduce -n 2 --algorithm rd|ring|shm --compare mpi`: on one host the shared
#: segment beats every point-to-point algorithm at every size; over MPI, two ranks do better with
#: one full recursive-doubling exchange than with the ring's two half exchanges up to 8 MiB. More
#: ranks: the ring moves 2(n-1)/n of the buffer instead of log2(n) whole buffers, so it takes over
#: much earlier (256 KiB, MPICH's default threshold).
DEFAULT_RULES: List[Rule] = [
    Rule("allreduce", "shm", team=(2, INF)),
    Rule("allreduce", "rd", msg=(0, 8 << 20), team=(1, 2)),
    Rule("allreduce", "ring", msg=(8 << 20, INF), team=(2, 2)),
    Rule("allreduce", "rd", msg=(0, 256 << 10), team=(3, INF)),
    Rule("allreduce", "ring", msg=(256 << 10, INF), team=(3, INF)),
    Rule("bcast", "shm", team=(2, INF)),
    Rule("bcast", "knomial"),
    Rule("barrier", "shm", team=(2, INF)),
    Rule("barrier", "dissemination"),
    Rule("reduce", "knomial"),
    Rule("allgather", "ring"),
    Rule("reduce_scatter", "ring"),
    Rule("alltoall", "pairwise"),
    Rule("gather", "linear"),
    Rule("scatter", "linear"),
    Rule("allgatherv", "ring"),
    Rule("reduce_scatterv", "ring"),
    Rule("alltoallv", "pairwise"),
    Rule("gatherv", "linear"),
    Rule("scatterv", "linear"),
]


def rules() -> List[Rule]:
    """The effective table: ``PYCOLL_TUNE``'s rules, then the defaults (parsed per value)."""
    text = config.get("PYCOLL_TUNE")
    cached = _parsed.get(text)
    if cached is None:
        cached = tuning.parse(text, ALGORITHMS) + DEFAULT_RULES
        _parsed.clear()
        _parsed[text] = cached
    return cached


_parsed: Dict[str, List[Rule]] = {}


def select(coll: str, size: int, nbytes: int, shared: bool = False, mem: str = "host") -> str:
    """The algorithm for a collective of ``nbytes`` on a team of ``size``; ``shared``: the team
    has a shared-memory segment and the call is untagged (so ``shm`` rules apply)."""
    if coll not in ALGORITHMS:
        raise ValueError(f"unknown collective {coll!r}")
    name = tuning.choose(rules(), coll, size, nbytes, mem, shared)
    if name is None:
        raise ValueError(f"no algorithm for {coll} on {size} ranks with {nbytes} B (check PYCOLL_TUNE)")
    return name


def get(coll: str, name: str) -> Builder:
    """The builder of algorithm ``name`` for ``coll``; ValueError naming the choices otherwise."""
    table = ALGORITHMS.get(coll)
    if table is None:
        raise ValueError(f"unknown collective {coll!r}; known: {', '.join(ALGORITHMS)}")
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {coll} algorithm {name!r}; known: {', '.join(table)}") from None
