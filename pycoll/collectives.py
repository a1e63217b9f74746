"""The table of collectives: one row per collective, read by every front end.

A row says what a collective is: its argument check (:mod:`pycoll.calls`, whose parameters are the
collective's parameters), its docstring, the mpi4py method and argument roles ``pycoll.mpi.Comm``
maps onto it, the ``torch.distributed`` name, nccl-tests' bus-bandwidth factor and the buffer
shapes ``pycoll perf`` sizes it with, a numpy reference of its result, and a default algorithm for
teams no selection rule covers. :class:`pycoll.Team` makes its methods from this table
(``team.<name>(...)`` and ``team.<name>_init(...)``), ``pycoll.mpi.Comm`` its ``X``/``IX``/
``X_init`` methods, ``pycoll perf`` its cases; algorithms register themselves by collective name
(:mod:`pycoll.algorithms`). Adding a collective is one row here plus its check and algorithm files.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from pycoll import calls
from pycoll.ops import ReduceOp
from pycoll.ops import reference as reduce_reference

#: A numpy reference: (every rank's input, this rank, team size, op, root) -> this rank's expected
#: output (None: nothing to check on this rank).
Reference = Callable[[Sequence[np.ndarray], int, int, ReduceOp, int], Optional[np.ndarray]]

#: nccl-tests' bus bandwidth factors by name (busbw = algbw * factor(n)); "-": no bandwidth.
FACTORS: Dict[str, Optional[Callable[[int], float]]] = {
    "2(n-1)/n": lambda n: 2 * (n - 1) / n,
    "(n-1)/n": lambda n: (n - 1) / n,
    "1": lambda n: 1.0,
    "-": None,
}


@dataclass(frozen=True)
class Collective:
    """One row of the table."""

    name: str
    #: ``check(rank, size, *args) -> Call``; its parameters after ``rank, size`` are the
    #: collective's positional parameters on every front end.
    check: Callable[..., calls.Call]
    doc: str
    #: The numpy reference of the result (perf checks against it).
    reference: Reference
    #: mpi4py's method ("": none) and its positional parameters, in mpi4py's order.
    mpi: str = ""
    mpi_params: Tuple[str, ...] = ()
    #: mpi4py vector buffers: MPI parameter -> the (counts, displs) parameters it carries.
    mpi_vector: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    #: Where mpi4py's ``MPI.IN_PLACE`` may stand and what it means: "swap" (the send buffer is the
    #: receive buffer: pycoll's ``(recvbuf, None)``), "sendbuf" or "recvbuf" (that one is None),
    #: "copy" (the input is in the receive buffer, whole: pycoll sends a copy of it, made per call).
    mpi_in_place: str = ""
    #: Buffers significant at the root only (None on the other ranks).
    root_only: Tuple[str, ...] = ()
    #: MPI parameter names that differ from pycoll's (MPI name -> pycoll name).
    mpi_rename: Dict[str, str] = field(default_factory=dict)
    #: The torch.distributed function this collective serves (None: none).
    torch: Optional[str] = None
    #: busbw factor (a key of FACTORS).
    factor: str = "-"
    #: What ``pycoll perf``'s size column is, and the send/receive buffer shapes it makes:
    #: "whole" (the size), "blocks" (the size as n equal blocks), "block" (one of those n blocks),
    #: "" (no such buffer).
    size: str = ""
    send: str = "whole"
    recv: str = "whole"
    #: It reduces with an op (the op must agree across ranks).
    reduces: bool = False
    #: It has a root (which must agree across ranks).
    rooted: bool = False
    #: What every rank gives alike besides the op and root, which the agreement check compares
    #: (:mod:`pycoll.agreement`): the buffer whose dtype must agree ("src", "dst"; "" for none),
    #: and whether its size must agree too ("size"), or the digest of the v-form's counts, which
    #: every rank knows ("counts"), or nothing ("": each rank knows its own blocks only; their
    #: sizes are compared pairwise, see ``agreement.flows``).
    agreed: str = ""
    agreed_count: str = ""
    #: A v-variant (``pycoll perf`` times it with equal counts).
    vector: bool = False
    #: The algorithm used when no selection rule matches (None: no rule matching is an error).
    default: Optional[str] = None

    @property
    def params(self) -> List[str]:
        """The collective's parameter names (those of its check after ``rank, size``)."""
        return list(inspect.signature(self.check).parameters)[2:]

    def signature(self) -> inspect.Signature:
        """The check's signature without ``rank, size`` (front ends build theirs from it)."""
        sig = inspect.signature(self.check)
        return sig.replace(parameters=list(sig.parameters.values())[2:])

    def bus_factor(self, n: int) -> Optional[float]:
        """busbw / algbw for ``n`` ranks (None: the collective moves no data)."""
        fn = FACTORS[self.factor]
        return None if fn is None else fn(n)

    @property
    def blocks(self) -> bool:
        """The size is ``n`` blocks, one per rank."""
        return bool({"block", "blocks"} & {self.send, self.recv})


# ---------------------------------------------------------------------------------- references
def _block(x: np.ndarray, r: int, n: int) -> np.ndarray:
    m = x.size // n
    return x[r * m:(r + 1) * m]


def _allreduce(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> np.ndarray:
    return reduce_reference(list(xs), op)


def _bcast(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> np.ndarray:
    return xs[root]


def _reduce(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> Optional[np.ndarray]:
    return reduce_reference(list(xs), op) if r == root else None


def _allgather(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> np.ndarray:
    return np.concatenate(xs)


def _reduce_scatter(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> np.ndarray:
    return _block(reduce_reference(list(xs), op), r, n)


def _alltoall(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> np.ndarray:
    return np.concatenate([_block(x, r, n) for x in xs])


def _gather(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> Optional[np.ndarray]:
    return np.concatenate(xs) if r == root else None


def _scatter(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> np.ndarray:
    return _block(xs[root], r, n)


def _scan(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> np.ndarray:
    return reduce_reference(list(xs[:r + 1]), op)


def _exscan(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> Optional[np.ndarray]:
    return reduce_reference(list(xs[:r]), op) if r else None  # (rank 0's output: untouched)


def _nothing(xs: Sequence[np.ndarray], r: int, n: int, op: ReduceOp, root: int) -> None:
    return None


_BLOCKS = "the n blocks together"
_COMMON = """

``priority`` orders it in the engine (lower first); ``tag`` matches it across ranks by tag instead of
posting order; ``algorithm`` forces one (other keywords, such as ``radix=``, are its options);
``timeout`` (seconds) overrides ``PYCOLL_TIMEOUT``. Returns a :class:`~pycoll.Request`; the
``_init`` form returns a persistent collective whose ``start()`` runs it again."""

TABLE: Tuple[Collective, ...] = (
    Collective(
        "allreduce", calls.allreduce,
        "Allreduce ``sendbuf`` into ``recvbuf`` (``None``: in place); ``wait()`` returns the output. "
        "``algorithm='push_pull'`` runs it as a BytePS push-sum-pull (SUM or AVG).",
        _allreduce, mpi="Allreduce", mpi_params=("sendbuf", "recvbuf", "op"), mpi_in_place="swap",
        torch="all_reduce", factor="2(n-1)/n", size="the buffer (send = recv)", reduces=True,
        agreed="src", agreed_count="size"),
    Collective(
        "bcast", calls.bcast, "Broadcast ``buf`` from team rank ``root`` into ``buf`` on every rank.",
        _bcast, mpi="Bcast", mpi_params=("buf", "root"), torch="broadcast", factor="1", size="the buffer",
        recv="", rooted=True, agreed="dst", agreed_count="size"),
    Collective(
        "reduce", calls.reduce,
        "Reduce every rank's ``sendbuf`` into ``recvbuf`` on ``root`` (``None`` at the root: in place; "
        "ignored elsewhere).",
        _reduce, mpi="Reduce", mpi_params=("sendbuf", "recvbuf", "op", "root"), mpi_in_place="swap",
        root_only=("recvbuf",), torch="reduce", factor="1",
        size="the buffer (sendbuf; recvbuf at the root)", reduces=True, rooted=True,
        agreed="src", agreed_count="size"),
    Collective(
        "allgather", calls.allgather,
        "Allgather: ``recvbuf`` gets every rank's ``sendbuf`` in rank order (``sendbuf=None``: in place, "
        "this rank's block of ``recvbuf`` is its contribution).",
        _allgather, mpi="Allgather", mpi_params=("sendbuf", "recvbuf"), mpi_in_place="sendbuf",
        torch="all_gather_into_tensor", factor="(n-1)/n", size=f"recvbuf, {_BLOCKS}", send="block",
        recv="blocks", agreed="src", agreed_count="size"),
    Collective(
        "allgatherv", calls.allgatherv,
        "Allgatherv: rank r contributes ``counts[r]`` elements, which land at ``displs[r]`` of every "
        "``recvbuf`` (default: back to back in rank order); ``sendbuf=None``: in place.",
        _allgather, mpi="Allgatherv", mpi_params=("sendbuf", "recvbuf"),
        mpi_vector={"recvbuf": ("counts", "displs")}, mpi_in_place="sendbuf", factor="(n-1)/n",
        size=f"recvbuf, {_BLOCKS} (equal counts)", send="block", recv="blocks",
        vector=True, agreed="src", agreed_count="counts"),
    Collective(
        "reduce_scatter", calls.reduce_scatter,
        "Reduce-scatter (block): rank r gets the reduction of block r of every rank's ``sendbuf`` "
        "(``team.size`` blocks of ``recvbuf``'s size).",
        _reduce_scatter, mpi="Reduce_scatter_block", mpi_params=("sendbuf", "recvbuf", "op"),
        mpi_in_place="copy", torch="reduce_scatter_tensor", factor="(n-1)/n", size=f"sendbuf, {_BLOCKS}",
        send="blocks", recv="block", reduces=True, agreed="dst", agreed_count="size"),
    Collective(
        "reduce_scatterv", calls.reduce_scatterv,
        "Reduce-scatterv (``MPI_Reduce_scatter``): ``sendbuf`` holds ``sum(counts)`` elements, block r "
        "(``counts[r]`` elements, in rank order) is reduced into rank r's ``recvbuf``.",
        _reduce_scatter, mpi="Reduce_scatter", mpi_params=("sendbuf", "recvbuf", "recvcounts", "op"),
        mpi_rename={"recvcounts": "counts"}, mpi_in_place="copy", factor="(n-1)/n",
        size=f"sendbuf, {_BLOCKS} (equal counts)", send="blocks", recv="block", reduces=True, vector=True,
        agreed="src", agreed_count="counts"),
    Collective(
        "alltoall", calls.alltoall,
        "Alltoall: block j of ``sendbuf`` goes to rank j, which puts it in block r (this rank) of its "
        "``recvbuf``.",
        _alltoall, mpi="Alltoall", mpi_params=("sendbuf", "recvbuf"), mpi_in_place="copy",
        torch="all_to_all_single",
        factor="(n-1)/n", size=f"sendbuf (= recvbuf), {_BLOCKS}", send="blocks", recv="blocks",
        agreed="src", agreed_count="size"),
    Collective(
        "alltoallv", calls.alltoallv,
        "Alltoallv: ``sendcounts[j]`` elements at ``sdispls[j]`` of ``sendbuf`` go to rank j, and "
        "``recvcounts[i]`` elements from rank i land at ``rdispls[i]`` of ``recvbuf`` (displacements "
        "default to back to back); ``recvcounts[i]`` must equal rank i's ``sendcounts[rank]``.",
        _alltoall, mpi="Alltoallv", mpi_params=("sendbuf", "recvbuf"),
        mpi_vector={"sendbuf": ("sendcounts", "sdispls"), "recvbuf": ("recvcounts", "rdispls")},
        mpi_in_place="copy", factor="(n-1)/n", size=f"sendbuf (= recvbuf), {_BLOCKS} (equal counts)",
        send="blocks", recv="blocks", vector=True, agreed="dst"),
    Collective(
        "gather", calls.gather,
        "Gather every rank's ``sendbuf`` into ``recvbuf`` on ``root`` (rank order; ``recvbuf`` is "
        "ignored on other ranks; ``sendbuf=None`` at the root: in place).",
        _gather, mpi="Gather", mpi_params=("sendbuf", "recvbuf", "root"), mpi_in_place="sendbuf",
        root_only=("recvbuf",), torch="gather", factor="(n-1)/n", size=f"recvbuf at the root, {_BLOCKS}",
        send="block", recv="blocks", rooted=True, agreed="src", agreed_count="size"),
    Collective(
        "gatherv", calls.gatherv,
        "Gatherv: rank r's ``sendbuf`` (``counts[r]`` elements) lands at ``displs[r]`` of ``recvbuf`` on "
        "``root``. ``counts`` is needed at the root; tree algorithms (``knomial``) need it on every "
        "rank, ``shm`` (the default on one host) and ``linear`` (elsewhere) only at the root.",
        _gather, mpi="Gatherv", mpi_params=("sendbuf", "recvbuf", "root"),
        mpi_vector={"recvbuf": ("counts", "displs")}, mpi_in_place="sendbuf", root_only=("recvbuf",),
        factor="(n-1)/n", size=f"recvbuf at the root, {_BLOCKS} (equal counts)",
        send="block", recv="blocks", rooted=True, vector=True, agreed="src"),
    Collective(
        "scatter", calls.scatter,
        "Scatter: block r of ``sendbuf`` on ``root`` goes to ``recvbuf`` of rank r (``sendbuf`` is "
        "ignored on other ranks; ``recvbuf=None`` at the root: in place).",
        _scatter, mpi="Scatter", mpi_params=("sendbuf", "recvbuf", "root"), mpi_in_place="recvbuf",
        root_only=("sendbuf",), torch="scatter", factor="(n-1)/n", size=f"sendbuf at the root, {_BLOCKS}",
        send="blocks", recv="block", rooted=True, agreed="dst", agreed_count="size"),
    Collective(
        "scatterv", calls.scatterv,
        "Scatterv: ``counts[r]`` elements at ``displs[r]`` of ``sendbuf`` on ``root`` go to rank r's "
        "``recvbuf``. ``counts`` as for gatherv.",
        _scatter, mpi="Scatterv", mpi_params=("sendbuf", "recvbuf", "root"),
        mpi_vector={"sendbuf": ("counts", "displs")}, mpi_in_place="recvbuf", root_only=("sendbuf",),
        factor="(n-1)/n", size=f"sendbuf at the root, {_BLOCKS} (equal counts)",
        send="blocks", recv="block", rooted=True, vector=True, agreed="dst"),
    Collective(
        "scan", calls.scan,
        "Scan (inclusive prefix reduction): rank r's ``recvbuf`` gets the reduction of the ``sendbuf`` "
        "of ranks 0..r (``None``: in place). Any op but AVG.",
        _scan, mpi="Scan", mpi_params=("sendbuf", "recvbuf", "op"), mpi_in_place="swap",
        factor="1", size="the buffer (send = recv)", reduces=True, default="rd",
        agreed="src", agreed_count="size"),
    Collective(
        "exscan", calls.exscan,
        "Exscan (exclusive prefix reduction): rank r's ``recvbuf`` gets the reduction of the "
        "``sendbuf`` of ranks 0..r-1; rank 0's is left as it was (MPI leaves it undefined). "
        "``None``: in place. Any op but AVG.",
        _exscan, mpi="Exscan", mpi_params=("sendbuf", "recvbuf", "op"), mpi_in_place="swap",
        factor="1", size="the buffer (send = recv)", reduces=True, default="rd",
        agreed="src", agreed_count="size"),
    Collective(
        "barrier", calls.barrier, "Barrier: the request completes once every rank of the team entered it.",
        _nothing, mpi="Barrier", torch="barrier", size="none: time only", send="", recv=""),
)

#: The rows by name.
COLLECTIVES: Dict[str, Collective] = {c.name: c for c in TABLE}


def get(name: str) -> Collective:
    """The row of collective ``name``; ValueError naming the known ones otherwise."""
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}") from None


def docstring(row: Collective) -> str:
    """The docstring of ``team.<name>``."""
    return row.doc + _COMMON
