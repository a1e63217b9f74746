"""Collective algorithms, found by collective and name: ``ALGORITHMS[coll][name]`` is the
``build(args) -> Task`` of that algorithm; :func:`select` picks one when the caller does not force
it with ``algorithm=``, by :func:`rules` (``PYCOLL_TUNE``'s, then :data:`DEFAULT_RULES`).

One module per algorithm: point-to-point ones in this package, :mod:`.shm` (ranks on one host:
the node's shared segment, a peer's memory), :mod:`.hier` (teams spanning nodes: levels that are
collectives of sub-teams). A module is an algorithm when it declares::

    NAME = "ring"                               # its name, under every collective below
    COLLECTIVES = ("allgather", "allgatherv")   # the collectives it implements
    OPTIONS = {"radix": Option(...)}            # the options it takes ({} for none; see .options)

    def build(args: CollArgs) -> Task: ...      # starts with opts = options(args, OPTIONS)

and, where a ``cma`` form publishes its addresses in the team's segment (so that, as the ``shm``
algorithms, it runs only untagged), ``SEGMENT = True``: selection passes it over for tagged calls.

Adding an algorithm is adding its file: this package and its sub-packages are walked (pkgutil)
when it is imported, every module is imported, and those with a ``NAME`` are registered; the
others (``base``, ``options``, ``patterns``, ``tuning``, ``push_pull``, ``hier.levels``) are not
algorithms. Only the selection rules are listed by hand, below.

Without the native build: the shared-memory algorithms need the compiled module
(``pycoll._native``, through :mod:`pycoll.native`), so they import it inside ``build`` and their
methods, never at the top of the module. Their modules therefore import (and register) in a
checkout without the native build, and building one there raises the native module's error.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional

from pycoll import config
from pycoll.algorithms import tuning
from pycoll.algorithms.base import CollArgs
from pycoll.algorithms.tuning import INF, Rule
from pycoll.tasks.task import Task

Builder = Callable[[CollArgs], Task]


def _discover() -> Dict[str, Dict[str, ModuleType]]:
    """``{coll: {name: module}}`` of every algorithm module of this package and its sub-packages,
    collectives and names in alphabetical order."""
    found: Dict[str, Dict[str, ModuleType]] = {}
    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
        module = importlib.import_module(info.name)
        name = getattr(module, "NAME", None)
        if info.ispkg or name is None:
            continue
        for attr in ("COLLECTIVES", "OPTIONS", "build"):
            if not hasattr(module, attr):
                raise ImportError(f"algorithm module {info.name} declares NAME but not {attr}")
        for coll in module.COLLECTIVES:
            table = found.setdefault(coll, {})
            if name in table:
                raise ImportError(f"{coll} algorithm {name!r} is declared by both {table[name].__name__} "
                                  f"and {info.name}")
            table[name] = module
    return {coll: dict(sorted(found[coll].items())) for coll in sorted(found)}


#: The module of every algorithm (its docstring says what it does, its ``OPTIONS`` what it takes).
MODULES: Dict[str, Dict[str, ModuleType]] = _discover()
#: The builder of every algorithm: ``ALGORITHMS[coll][name](args) -> Task``.
ALGORITHMS: Dict[str, Dict[str, Builder]] = {
    coll: {name: module.build for name, module in table.items()} for coll, table in MODULES.items()
}

#: The default selection table: the first rule that matches wins. Why each rule is there and the
#: measurements it rests on: docs/selection.md.
DEFAULT_RULES: List[Rule] = [
    # Teams spanning nodes (only there): hierarchical allreduce and bcast for large messages.
    Rule("allreduce", "split_rail", msg=(256 << 10, INF)),
    Rule("bcast", "hier", msg=(1 << 20, INF)),
    # allreduce: on one host the single copy from 256 KiB below 16 MiB on 4+ ranks where it is
    # fast (from 16 MiB the segment's streamed copies out win), else the shared segment; off it
    # rd for small messages, ring for large.
    Rule("allreduce", "cma", msg=(256 << 10, 16 << 20), team=(4, INF), cma_speed="fast"),
    Rule("allreduce", "shm", team=(2, INF)),
    Rule("allreduce", "rd", team=(1, 1)),  # (a copy, at any size)
    Rule("allreduce", "rd", msg=(0, 8 << 20), team=(2, 2)),
    Rule("allreduce", "ring", msg=(8 << 20, INF), team=(2, 2)),
    Rule("allreduce", "rd", msg=(0, 256 << 10), team=(3, INF)),
    Rule("allreduce", "ring", msg=(256 << 10, INF), team=(3, INF)),
    # bcast and barrier: the shared segment on one host (two ranks from 64 KiB below 1 MiB: the
    # single copy); else the k-nomial tree, dissemination.
    Rule("bcast", "cma", msg=(64 << 10, 1 << 20), team=(2, 2)),
    Rule("bcast", "shm", team=(2, INF)),
    Rule("bcast", "knomial"),
    Rule("barrier", "shm", team=(2, INF)),
    Rule("barrier", "dissemination"),
    # reduce: the shared segment on one host; else Rabenseifner's from 4 MiB, the tree below.
    Rule("reduce", "shm", team=(2, INF)),
    Rule("reduce", "rs_gather", msg=(4 << 20, INF), team=(2, INF)),
    Rule("reduce", "knomial"),
    # allgather: cma for two ranks on one host from 2 MiB, else the segment; rd, then the ring.
    Rule("allgather", "cma", msg=(2 << 20, INF), team=(2, 2)),
    Rule("allgather", "shm", team=(2, INF)),
    Rule("allgather", "rd", msg=(0, 4 << 20), team=(3, INF)),
    Rule("allgather", "ring"),
    # reduce_scatter: the segment on one host; recursive halving below 1 MiB, then the ring.
    Rule("reduce_scatter", "shm", team=(2, INF)),
    Rule("reduce_scatter", "rhalving", msg=(0, 1 << 20)),
    Rule("reduce_scatter", "ring"),
    # alltoall: on one host the single copy (two ranks: from 64 KiB, 256 KiB where it is slow;
    # more: at every size, small blocks passing through the senders' slots), the segment below;
    # Bruck for small messages on 4+ ranks, else pairwise exchange.
    Rule("alltoall", "cma", msg=(64 << 10, INF), team=(2, 2), cma_speed="fast"),
    Rule("alltoall", "cma", msg=(256 << 10, INF), team=(2, 2)),
    Rule("alltoall", "cma", team=(3, INF)),
    Rule("alltoall", "shm", msg=(0, 256 << 10), team=(2, INF)),
    Rule("alltoall", "bruck", msg=(0, 128 << 10), team=(4, INF)),
    Rule("alltoall", "pairwise"),
    # gather and scatter on one host: the single copy (gather: two ranks, 128 KiB to 1 MiB;
    # scatter: from 64 KiB on two ranks, 256 KiB on more; on two ranks only where it is fast),
    # else the segment (scatter below 512 KiB; where the single copy is slow, on two ranks below
    # 4 MiB: measured to 2 MiB); the k-nomial tree gathers 1-8 MiB on 3+ ranks across hosts; linear otherwise.
    Rule("gather", "cma", msg=(128 << 10, 1 << 20), team=(2, 2), cma_speed="fast"),
    Rule("gather", "shm", team=(2, INF)),
    Rule("gather", "knomial", msg=(1 << 20, 8 << 20), team=(3, INF)),
    Rule("gather", "linear"),
    Rule("scatter", "cma", msg=(64 << 10, INF), team=(2, 2), cma_speed="fast"),
    Rule("scatter", "cma", msg=(256 << 10, INF), team=(3, INF)),
    Rule("scatter", "shm", msg=(0, 512 << 10), team=(2, INF)),
    Rule("scatter", "shm", msg=(512 << 10, 4 << 20), team=(2, 2), cma_speed="slow"),
    Rule("scatter", "linear"),
    # The v-forms: as their block forms, except the trees (knomial needs counts on every rank).
    Rule("allgatherv", "cma", msg=(2 << 20, INF), team=(2, 2)),
    Rule("allgatherv", "shm", team=(2, INF)),
    Rule("allgatherv", "rd", msg=(0, 4 << 20), team=(3, INF)),
    Rule("allgatherv", "ring"),
    Rule("reduce_scatterv", "shm", team=(2, INF)),
    Rule("reduce_scatterv", "rhalving", msg=(0, 1 << 20)),
    Rule("reduce_scatterv", "ring"),
    # alltoallv, gatherv, scatterv select by team size alone (the ranks do not all know the
    # sizes). alltoallv and scatterv: the single copy where the ranks may read each other's
    # memory (its sender passes small blocks through its slot, so it costs what the segment form
    # does there and one copy less for large blocks), else the segment; gatherv: the segment.
    Rule("alltoallv", "cma", team=(2, INF)),
    Rule("alltoallv", "shm", team=(2, INF)),
    Rule("alltoallv", "pairwise"),
    Rule("gatherv", "shm", team=(2, INF)),
    Rule("gatherv", "linear"),
    Rule("scatterv", "cma", team=(2, INF)),
    Rule("scatterv", "shm", team=(2, INF)),
    Rule("scatterv", "linear"),
    # scan, exscan: the segment on one host, else recursive doubling (the table's default).
    Rule("scan", "shm", team=(2, INF)),
    Rule("exscan", "shm", team=(2, INF)),
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


def select(coll: str, size: int, nbytes: int, shared: bool = False, mem: str = "host",
           cma: bool = False, hier: bool = False, *, cma_slow: bool = False,
           default: Optional[str] = None) -> str:
    """The algorithm for a collective of ``nbytes`` on a team of ``size``; ``shared``: the team
    has a shared-memory segment and the call is untagged (so ``shm`` rules apply); ``cma``: its
    ranks may read each other's memory (``cma`` rules apply); ``cma_slow``: such a read costs
    more than two copies here (``cma_speed`` rules say which apply); ``hier``: it spans several nodes and
    has node sub-teams (hierarchical rules apply). When no rule matches: ``default`` (a collective
    with no rule yet falls back to its default algorithm), or ValueError when it is None."""
    if coll not in ALGORITHMS:
        raise ValueError(f"unknown collective {coll!r}")
    cma = cma and (shared or not getattr(MODULES[coll].get("cma"), "SEGMENT", False))  # tagged: not there
    name = tuning.choose(rules(), coll, size, nbytes, mem, shared, cma, hier, cma_slow)
    if name is None:
        if default is not None:
            return default
        raise ValueError(f"no algorithm for {coll} on {size} ranks with {nbytes} B (check PYCOLL_TUNE)")
    return name


def register(module: ModuleType, *, replace: bool = False) -> None:
    """Add the algorithm ``module`` declares (``NAME``, ``COLLECTIVES``, ``OPTIONS``, ``build``: as
    a file of this package does) to the tables, for each of its collectives: ``algorithm=NAME``
    and ``PYCOLL_TUNE`` rules can name it from then on (register it on every rank, before the
    collectives that use it). ValueError if a collective has an algorithm of that name already
    (unless ``replace``) or the collective is unknown."""
    for attr in ("NAME", "COLLECTIVES", "OPTIONS", "build"):
        if not hasattr(module, attr):
            what = getattr(module, "__name__", module)
            raise ValueError(f"{what!r} declares no {attr} (see pycoll.algorithms)")
    for coll in module.COLLECTIVES:
        if coll not in ALGORITHMS:
            raise ValueError(f"unknown collective {coll!r}; known: {', '.join(ALGORITHMS)}")
        if module.NAME in ALGORITHMS[coll] and not replace:
            raise ValueError(f"{coll} has an algorithm {module.NAME!r} already (replace=True replaces it)")
    for coll in module.COLLECTIVES:
        MODULES[coll][module.NAME] = module
        ALGORITHMS[coll][module.NAME] = module.build
    _parsed.clear()  # (PYCOLL_TUNE's rules are checked against the names when parsed)


def get(coll: str, name: str) -> Builder:
    """The builder of algorithm ``name`` for ``coll``; ValueError naming the choices otherwise."""
    table = ALGORITHMS.get(coll)
    if table is None:
        raise ValueError(f"unknown collective {coll!r}; known: {', '.join(ALGORITHMS)}")
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {coll} algorithm {name!r}; known: {', '.join(table)}") from None


def declared_options(coll: str, name: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """The ``options`` that algorithm ``name`` of ``coll`` declares. A call that names no
    algorithm may pass options meant for some of the algorithms selection can pick (the ring's
    ``fragment_bytes``); the one selected takes those it knows. A call that names its algorithm
    gets every option checked by it (an unknown one is an error)."""
    module = MODULES.get(coll, {}).get(name)
    known = getattr(module, "OPTIONS", None)
    if known is None:
        return options
    return {k: v for k, v in options.items() if k in known}
