"""Collective algorithms: one file each, registered here by collective and name.

``ALGORITHMS[coll][name]`` is ``build(args) -> Task``. :func:`select` picks one when the caller
does not force it with ``algorithm=``.
"""

from __future__ import annotations

from typing import Callable, Dict, List

from pycoll import config
from pycoll.algorithms import (
    allgather_bruck,
    allgather_cma,
    allgather_rd,
    allgather_ring,
    allreduce_knomial,
    allreduce_rab,
    allreduce_rd,
    allreduce_ring,
    allreduce_split_rail,
    alltoall_bruck,
    alltoall_pairwise,
    barrier_dissemination,
    barrier_hier,
    bcast_hier,
    bcast_knomial,
    bcast_scatter_allgather,
    gather_knomial,
    gather_linear,
    reduce_knomial,
    reduce_rs_gather,
    reduce_scatter_rhalving,
    reduce_scatter_ring,
    scatter_knomial,
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
        "rab": allreduce_rab.build,
        "split_rail": allreduce_split_rail.build,
    },
    "bcast": {
        "knomial": bcast_knomial.build,
        "scatter_allgather": bcast_scatter_allgather.build,
        "shm": _shm("bcast_shm"),
        "hier": bcast_hier.build,
    },
    "barrier": {
        "dissemination": barrier_dissemination.build,
        "shm": _shm("barrier_shm"),
        "hier": barrier_hier.build,
    },
    "reduce": {"knomial": reduce_knomial.build, "shm": _shm("reduce_shm"),
               "rs_gather": reduce_rs_gather.build},
    "allgather": {"ring": allgather_ring.build, "shm": _shm("allgather_shm"), "rd": allgather_rd.build,
                  "bruck": allgather_bruck.build, "cma": allgather_cma.build},
    "reduce_scatter": {"ring": reduce_scatter_ring.build, "shm": _shm("reduce_scatter_shm"),
                       "rhalving": reduce_scatter_rhalving.build},
    "alltoall": {"pairwise": alltoall_pairwise.build, "bruck": alltoall_bruck.build},
    "gather": {"linear": gather_linear.build, "knomial": gather_knomial.build},
    "scatter": {"linear": scatter_linear.build, "knomial": scatter_knomial.build},
    # the v-variants: blocks of any size (args.layout), so only algorithms that handle them
    "allgatherv": {"ring": allgather_ring.build, "shm": _shm("allgather_shm"), "rd": allgather_rd.build,
                   "bruck": allgather_bruck.build, "cma": allgather_cma.build},
    "reduce_scatterv": {"ring": reduce_scatter_ring.build, "shm": _shm("reduce_scatter_shm"),
                        "rhalving": reduce_scatter_rhalving.build},
    "alltoallv": {"pairwise": alltoall_pairwise.build},
    "gatherv": {"linear": gather_linear.build, "knomial": gather_knomial.build},
    "scatterv": {"linear": scatter_linear.build, "knomial": scatter_knomial.build},
}



#: The default selection table. Measured on the 2-core development VM with
#: `pycoll perf allreduce -n 2 --algorithm rd|ring|shm --compare mpi`: on one host the shared
#: segment beats every point-to-point algorithm at every size; over MPI, two ranks do better with
#: one full recursive-doubling exchange than with the ring's two half exchanges up to 8 MiB. More
#: ranks: the ring moves 2(n-1)/n of the buffer instead of log2(n) whole buffers, so it takes over
#: much earlier (256 KiB, MPICH's default threshold).
DEFAULT_RULES: List[Rule] = [
    # Teams spanning nodes (these rules apply only there). 8 ranks as 2 nodes (4 + 4) and 4 as 2
    # (2 + 2), levels between nodes on UCX over TCP, node level on the shared segment, us per call,
    # hierarchical / flat (PYCOLL_RANKS_PER_NODE=4|2 PYCOLL_TLS=ucx,shm UCX_TLS=tcp mpiexec -n 8|4
    # python benchmarks/hierarchical.py):
    #   allreduce rab / split_rail / flat rd or ring:
    #     n=8 8 B 1449 / 2709 / 629; 64 KiB 1628 / 3477 / 1640;
    #     1 MiB 8959 / 6187 / 15727; 16 MiB 105183 / 54138 / 207912
    #     n=4 8 B 585 / 898 / 216; 64 KiB 1130 / 1223 / 590; 256 KiB 1233 / 1153 / 1409;
    #     1 MiB 4470 / 4353 / 9177
    #   bcast hier / knomial: n=8 8 B 800 / 127; 1 MiB 5376 / 11133; 16 MiB 58900 / 149887
    #     n=4 64 KiB 498 / 201; 256 KiB 1514 / 1093; 1 MiB 2866 / 3728
    #   barrier hier / dissemination: n=8 1131 / 594; n=4 705 / 182
    # -> split_rail from 256 KiB, hier bcast from 1 MiB; below, three dependent phases (each a hand-over
    #    between processes sharing 2 cores) cost more than the flat algorithms' rounds, so the flat
    #    rules below apply (rab and the hier barrier stay available by name and through PYCOLL_TUNE).
    Rule("allreduce", "split_rail", msg=(256 << 10, INF)),
    Rule("bcast", "hier", msg=(1 << 20, INF)),
    Rule("allreduce", "shm", team=(2, INF)),
    Rule("allreduce", "rd", msg=(0, 8 << 20), team=(1, 2)),
    Rule("allreduce", "ring", msg=(8 << 20, INF), team=(2, 2)),
    Rule("allreduce", "rd", msg=(0, 256 << 10), team=(3, INF)),
    Rule("allreduce", "ring", msg=(256 << 10, INF), team=(3, INF)),
    Rule("bcast", "shm", team=(2, INF)),
    # bcast, reduce, gather, scatter over MPI (PYCOLL_TLS=mpi, root 0; best of 3-15 interleaved rounds,
    # us per call, max over ranks; /tmp/venv/bin/mpiexec -n 2|4|8 with a script timing
    # team.<coll>(..., algorithm=...) against comm.Bcast/Reduce/Gather/Scatter):
    #   bcast n=4   8 B: knomial 38 / scatter_allgather 146 / MPI 13; 1 MiB: 525 / 684 / 635;
    #               16 MiB: 7011 / 7549 / 9577 (n=2 16 MiB: 1837 / 2057 / 1923; n=8: 20700 / 25931)
    #   -> knomial everywhere: on one host both move (n-1) x the buffer through memory, and the
    #      ring's n-1 steps cost more; scatter_allgather is there for bandwidth-bound networks.
    Rule("bcast", "knomial"),
    Rule("barrier", "shm", team=(2, INF)),
    Rule("barrier", "dissemination"),
    #   reduce float32 SUM, knomial / rs_gather / MPI: n=2 16 MiB: 10586 / 6924 / 30892;
    #   n=4 1 MiB: 654-1562 / 893-1089 (noise); 4 MiB: 3599 / 2867 / 3826; 16 MiB: 25153 / 17737 / 55885;
    #   n=8 4 MiB: 13910 / 13611; 8 MiB: 32915 / 21638; 16 MiB: 81118 / 51376 / 153430
    #   -> rs_gather from 4 MiB (every rank reduces 1/n of the buffer per step, not log2(n) buffers)
    #   On one host (untagged calls on a team with a segment), shm / best point-to-point / MPI,
    #   median of interleaved bursts, us per call (scripts timing team.<coll>(..., algorithm="shm")
    #   and algorithm=None against comm.Reduce/Allgather/Reduce_scatter_block, float32, root 0):
    #     n=2  reduce 8 B: 10.6 / 21.3 / 2.8; 64 KiB: 18.9 / 69.1 / 59.0; 16 MiB: 2106 / 4649 / 21596
    #          allgather 8 B: 10.8 / 26.0 / 3.0; 64 KiB: 19.0 / 43.6 / 12.1; 16 MiB: 2757 / 2772 / 2132
    #          reduce_scatter 8 B: 11.6 / 30.8 / 3.2; 64 KiB: 19.2 / 53.9 / 19.6; 16 MiB: 2274 / 3636 / 4880
    #     n=4  reduce 8 B: 137 / 65 / 12; 64 KiB: 167 / 275 / 151; 16 MiB: 8548 / 14169 / 46052
    #          allgather 8 B: 69 / 190 / 20; 64 KiB: 89 / 304 / 54; 16 MiB: 5031 / 6284 / 6011
    #          reduce_scatter 8 B: 72 / 248 / 21; 64 KiB: 99 / 382 / 81; 16 MiB: 4619 / 9402 / 9422
    #   -> shm everywhere (4 ranks on 2 cores: an 8 B reduce loop favours the tree, whose non-roots
    #      run ahead with eager sends; not worth a rule on an oversubscribed VM).
    Rule("reduce", "shm", team=(2, INF)),
    Rule("reduce", "rs_gather", msg=(4 << 20, INF), team=(2, INF)),
    Rule("reduce", "knomial"),
    # Two ranks, large: shm copies each block three times (into the slot, out to every rank, plus
    # the own block), cma once (read straight from the peer). `pycoll perf allgather -n 2|4
    # --min-bytes 64K --max-bytes 16M --algorithm cma|shm --compare mpi`, us (MPI/pycoll):
    #   n=2 cma / shm: 1 MiB 146-150 / 155-156; 2 MiB 236-246 / 298-314; 4 MiB 362-764 / 607-610;
    #       8 MiB 887-1025 / 1282-1403; 16 MiB 2307-2776 (0.97-1.05) / 2875-3042 (0.77)
    #   n=4 (on 2 cores) cma / shm: 4 MiB 2742 / 1130; 16 MiB 8500 / 5021 -> shm
    Rule("allgather", "cma", msg=(2 << 20, INF), team=(2, 2)),
    Rule("allgather", "shm", team=(2, INF)),
    # allgather, reduce_scatter, alltoall point to point, float32, us per call (min over 2-4 runs of
    # best-of-3 interleaved rounds, max over ranks; 2 cores shared with other jobs, so +-30%):
    #   PYCOLL_TLS=mpi mpiexec -n 2|3|4|6|8 python benchmarks/p2p_algorithms.py --sizes 8,1K,64K,1M,4M,16M
    #   (alltoall 64K-256K: --colls alltoall --sizes 64K,256K,512K --repeat 5); "8 B" is one element
    #   per rank (the smallest whole buffer: 4n bytes)
    #   allgather ring / rd / bruck / MPI:  n=2: the same one exchange (8 B: 34 / 33 / 37 / 5)
    #     n=3  8 B: 155 / 126 / 197 / 18; 64 KiB: 274 / 200 / 284 / 65; 4 MiB: 3896 / 2454 / 2400 / 1264;
    #          16 MiB: 5933 / 7689 / 6308 / 5442
    #     n=4  8 B: 193 / 155 / 171 / 21; 64 KiB: 359 / 277 / 309 / 70; 1 MiB: 525 / 442 / 492 / 246;
    #          4 MiB: 1736 / 1631 / 1968 / 1552; 16 MiB: 6543 / 6959 / 7125 / 6189
    #     n=6  8 B: 456 / 394 / 433 / 57; 1 MiB: 1620 / 922 / 1060 / 503; 4 MiB: 4475 / 5660 / 3525 / 2921
    #     n=8  8 B: 789 / 595 / 633 / 80; 1 MiB: 5489 / 1706 / 1580 / 937; 16 MiB: 16862 / 13057 / 13938
    #   -> rd below 4 MiB on 3+ ranks (log2 rounds; above, the fold's extra whole-buffer send of
    #      non-power-of-two teams costs more than the ring's extra rounds); bruck is not better here.
    #   reduce_scatter ring / rhalving / MPI: n=2 8 B: 44 / 42 / 6; 1 MiB: 222 / 205 / 253
    #     n=3  8 B: 182 / 127 / 15; 64 KiB: 318 / 179 / 114; 1 MiB: 588-875 / 579-1411; 16 MiB: 8142 / 11287
    #     n=4  8 B: 251 / 169 / 23; 1 MiB: 1302 / 681 / 443; 4 MiB: 5103 / 5028; 16 MiB: 10808 / 12413
    #     n=6  64 KiB: 1404 / 740 / 269; 1 MiB: 2061 / 2252 / 1261; 16 MiB: 15783 / 21485 / 14861
    #     n=8  64 KiB: 2205 / 1085 / 257; 1 MiB: 8770 / 2429 / 1359; 16 MiB: 22870 / 25649 / 19276
    #   -> rhalving below 1 MiB (non-power-of-two teams lose at 1 MiB: the fold sends whole buffers)
    #   alltoall pairwise / bruck / MPI: n=2, 3: pairwise at every size (n=3 8 B: 191 / 195 / 21)
    #     n=4  8 B: 234 / 171 / 28; 64 KiB: 320 / 309 / 77; 256 KiB: 372 / 598 / 105; 1 MiB: 553 / 2316
    #     n=6  8 B: 576 / 437 / 64; 64 KiB: 876 / 714 / 164; 256 KiB: 945 / 984 / 232
    #     n=8  8 B: 1039 / 593 / 107; 64 KiB: 1790 / 1149 / 310; 256 KiB: 1914 / 2086 / 388
    #   -> bruck below 128 KiB on 4+ ranks (it copies every block log2(n)/2 times)
    Rule("allgather", "rd", msg=(0, 4 << 20), team=(3, INF)),
    Rule("allgather", "ring"),
    Rule("reduce_scatter", "shm", team=(2, INF)),
    Rule("reduce_scatter", "rhalving", msg=(0, 1 << 20)),
    Rule("reduce_scatter", "ring"),
    Rule("alltoall", "bruck", msg=(0, 128 << 10), team=(4, INF)),
    Rule("alltoall", "pairwise"),
    #   gather linear / knomial / MPI (whole buffer): n=4 64 KiB: 201 / 186 / 85; 1 MiB: 361 / 319 / 489;
    #   4 MiB: 774 / 748 / 1782; 8 MiB: 1158 / 2277 / 4519; 16 MiB: 2342 / 3639 / 9152;
    #   n=8 1 MiB: 967 / 825; 4 MiB: 2347 / 1863; 8 MiB: 4267 / 3859; 16 MiB: 8616 / 15836 (n=2: one message)
    #   scatter linear / knomial: n=4 1 MiB: 718 / 786; 16 MiB: 2404 / 3647; n=8 1 MiB: 586 / 650
    #   -> knomial gathers 1-8 MiB on 3+ ranks (fewer, larger messages into the root); linear scatters.
    #   The v-forms keep linear: knomial needs counts on every rank.
    Rule("gather", "knomial", msg=(1 << 20, 8 << 20), team=(3, INF)),
    Rule("gather", "linear"),
    Rule("scatter", "linear"),
    Rule("allgatherv", "cma", msg=(2 << 20, INF), team=(2, 2)),  # as allgather
    Rule("allgatherv", "shm", team=(2, INF)),
    Rule("allgatherv", "rd", msg=(0, 4 << 20), team=(3, INF)),  # as allgather
    Rule("allgatherv", "ring"),
    Rule("reduce_scatterv", "shm", team=(2, INF)),
    Rule("reduce_scatterv", "rhalving", msg=(0, 1 << 20)),  # as reduce_scatter
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


def select(coll: str, size: int, nbytes: int, shared: bool = False, mem: str = "host",
           cma: bool = False, hier: bool = False) -> str:
    """The algorithm for a collective of ``nbytes`` on a team of ``size``; ``shared``: the team
    has a shared-memory segment and the call is untagged (so ``shm`` rules apply); ``cma``: its
    ranks may read each other's memory (``cma`` rules apply); ``hier``: it spans several nodes and
    has node sub-teams (hierarchical rules apply)."""
    if coll not in ALGORITHMS:
        raise ValueError(f"unknown collective {coll!r}")
    name = tuning.choose(rules(), coll, size, nbytes, mem, shared, cma, hier)
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
