"""Argument checks: turn one rank's collective call into a checked :class:`Call`.

Every collective of the table (:mod:`pycoll.collectives`) has a check here, named after it, taking
the calling rank, the team size and the user's arguments. It converts buffers to typed 1-D numpy
views, checks sizes, dtypes, roots, ops and layouts, and raises ``ValueError``/``TypeError`` before
anything is sent or any message key is taken. The planner builds a task from the :class:`Call`.
"""

from __future__ import annotations

import itertools
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from pycoll.buffers import address, as_array, as_bytes
from pycoll.ops import ReduceOp, as_op, check_op

Layout = Tuple[Tuple[int, int], ...]
_EMPTY = np.empty(0, np.uint8)
_ndarray = np.ndarray


class Call(NamedTuple):
    """One checked collective call, what the planner builds a task from."""

    coll: str
    src: np.ndarray
    dst: np.ndarray
    op: ReduceOp
    root: int
    out: Any  # what the request's wait() returns
    #: Bytes the selection table is looked up with: the same on every rank (the whole buffer of
    #: the block collectives; 0 where ranks can't know it: alltoallv, gatherv, scatterv).
    nbytes: int
    layout: Optional[Layout] = None  # v-collectives: the caller's blocks
    rlayout: Optional[Layout] = None


BARRIER = Call("barrier", _EMPTY, _EMPTY, ReduceOp.SUM, 0, None, 0)
#: The root of :data:`REJECTION` (a barrier has none: 0 in every other one).
REJECTED = 0x7E1EC7ED
#: What a rank takes part in at the place of a collective whose arguments failed its own checks
#: (:meth:`pycoll.planner.Planner.reject`): a barrier whose root marks it, so that it agrees with
#: the ranks that rejected the same call and disagrees with those that posted it.
REJECTION = Call("barrier", _EMPTY, _EMPTY, ReduceOp.SUM, REJECTED, None, 0)
#: ``_new(Call, (fields...))``: a Call without the NamedTuple's Python-level ``__new__`` (a
#: quarter of a microsecond), for the checks of the small collectives called most (all nine fields).
_new = tuple.__new__


def equal_layout(m: int, n: int) -> List[Tuple[int, int]]:
    """The layout of ``n`` blocks of ``m`` elements each, back to back."""
    return [(i * m, m) for i in range(n)]


def block_layout(call: Call, n: int) -> Optional[List[Tuple[int, int]]]:
    """The blocks of a call on ``n`` ranks: its own layout (v-collectives), equal blocks of the
    non-v block collectives, None for the others."""
    if call.layout is not None:
        return list(call.layout)
    coll = call.coll
    if coll in ("allgather", "gather"):
        return equal_layout(call.src.size, n)
    if coll in ("reduce_scatter", "scatter"):
        return equal_layout(call.dst.size, n)
    if coll == "alltoall":
        return equal_layout(call.src.size // n, n)
    return None


# ---------------------------------------------------------------------------------- the checks
def allreduce(rank: int, size: int, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM) -> Call:
    if type(op) is not ReduceOp:
        op = as_op(op)
    if (type(sendbuf) is _ndarray and type(recvbuf) is _ndarray and sendbuf.ndim == 1 and recvbuf.ndim == 1
            and sendbuf.dtype == recvbuf.dtype and sendbuf.size == recvbuf.size
            and sendbuf.flags.c_contiguous and (flags := recvbuf.flags).c_contiguous and flags.writeable):
        src, dst, out = sendbuf, recvbuf, recvbuf  # the common case, checked inline (as elementwise)
        if sendbuf.base is not None or recvbuf.base is not None:  # (views: they may overlap)
            src = apart(src, dst, "allreduce")
    else:
        src, dst, out = elementwise(sendbuf, recvbuf, "allreduce")
    check_op(op, src.dtype)
    return _new(Call, ("allreduce", src, dst, op, 0, out, dst.nbytes, None, None))


def scan(rank: int, size: int, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM) -> Call:
    return _prefix("scan", sendbuf, recvbuf, op)


def exscan(rank: int, size: int, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM) -> Call:
    return _prefix("exscan", sendbuf, recvbuf, op)


def _prefix(coll: str, sendbuf: Any, recvbuf: Any, op: Any) -> Call:
    """The check of a prefix reduction (scan, exscan): elementwise, any op but AVG."""
    op = as_op(op)
    if op is ReduceOp.AVG:
        raise ValueError(f"{coll}: AVG is not a prefix reduction (MPI has none either)")
    src, dst, out = elementwise(sendbuf, recvbuf, coll)
    check_op(op, src.dtype)
    return Call(coll, src, dst, op, 0, out, dst.nbytes)


def bcast(rank: int, size: int, buf: Any, root: int = 0) -> Call:
    arr = as_bytes(buf, writable=True, what="buf")  # a broadcast moves bytes, whatever the type
    if type(root) is not int or not 0 <= root < size:
        check_root(root, size, "bcast")
    return _new(Call, ("bcast", arr, arr, ReduceOp.SUM, root, buf, arr.nbytes, None, None))


def barrier(rank: int, size: int) -> Call:
    return BARRIER


def reduce(rank: int, size: int, sendbuf: Any, recvbuf: Any = None, op: Any = ReduceOp.SUM,
           root: int = 0) -> Call:
    op = as_op(op)
    check_root(root, size, "reduce")
    if rank == root:
        src, dst, out = elementwise(sendbuf, recvbuf, "reduce")
    else:
        src = dst = as_array(sendbuf, what="sendbuf")
        out = None
    check_op(op, src.dtype)
    return Call("reduce", src, dst, op, root, out, src.nbytes)


def allgather(rank: int, size: int, sendbuf: Any, recvbuf: Any) -> Call:
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    if dst.size % size:
        raise ValueError(f"allgather: recvbuf of {dst.size} elements is not {size} equal blocks")
    m = dst.size // size
    src = contribution(sendbuf, dst, (rank * m, m), rank, "allgather")
    return Call("allgather", src, dst, ReduceOp.SUM, 0, recvbuf, dst.nbytes)


def allgatherv(rank: int, size: int, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
               displs: Optional[Sequence[int]] = None) -> Call:
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    layout = check_layout(counts, displs, dst.size, size, "allgatherv", "recvbuf")
    src = contribution(sendbuf, dst, layout[rank], rank, "allgatherv", layout)
    return Call("allgatherv", src, dst, ReduceOp.SUM, 0, recvbuf, span(layout) * dst.itemsize, layout)


def reduce_scatter(rank: int, size: int, sendbuf: Any, recvbuf: Any, op: Any = ReduceOp.SUM) -> Call:
    op = as_op(op)
    src = as_array(sendbuf, what="sendbuf")
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    if src.dtype != dst.dtype or src.size != size * dst.size:
        raise ValueError(f"reduce_scatter: sendbuf ({src.size} x {src.dtype}) must hold {size} blocks of "
                         f"recvbuf ({dst.size} x {dst.dtype})")
    apart(dst, src, "reduce_scatter", (rank * dst.size, dst.size))  # (its own block: in place)
    check_op(op, src.dtype)
    return Call("reduce_scatter", src, dst, op, 0, recvbuf, src.nbytes)


def reduce_scatterv(rank: int, size: int, sendbuf: Any, recvbuf: Any, counts: Sequence[int],
                    op: Any = ReduceOp.SUM) -> Call:
    op = as_op(op)
    src = as_array(sendbuf, what="sendbuf")
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    layout = check_layout(counts, None, src.size, size, "reduce_scatterv", "sendbuf")
    if src.dtype != dst.dtype or dst.size != layout[rank][1]:
        raise ValueError(f"reduce_scatterv: recvbuf ({dst.size} x {dst.dtype}) must hold "
                         f"counts[{rank}] = {layout[rank][1]} elements of {src.dtype}")
    apart(dst, src, "reduce_scatterv", layout[rank], layout)
    check_op(op, src.dtype)
    return Call("reduce_scatterv", src, dst, op, 0, recvbuf, span(layout) * src.itemsize, layout)


def alltoall(rank: int, size: int, sendbuf: Any, recvbuf: Any) -> Call:
    src = as_array(sendbuf, what="sendbuf")
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    if src.dtype != dst.dtype or src.size != dst.size or src.size % size:
        raise ValueError(f"alltoall: sendbuf ({src.size} x {src.dtype}) and recvbuf ({dst.size} x "
                         f"{dst.dtype}) must be equal and hold {size} blocks")
    src = apart(src, dst, "alltoall")
    return Call("alltoall", src, dst, ReduceOp.SUM, 0, recvbuf, src.nbytes)


def alltoallv(rank: int, size: int, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int],
              recvcounts: Sequence[int], sdispls: Optional[Sequence[int]] = None,
              rdispls: Optional[Sequence[int]] = None) -> Call:
    src = as_array(sendbuf, what="sendbuf")
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    if src.dtype != dst.dtype:
        raise ValueError(f"alltoallv: sendbuf is {src.dtype}, recvbuf {dst.dtype}; they must match")
    layout = check_layout(sendcounts, sdispls, src.size, size, "alltoallv", "sendbuf", overlap=True)
    rlayout = check_layout(recvcounts, rdispls, dst.size, size, "alltoallv", "recvbuf")
    if layout[rank][1] != rlayout[rank][1]:
        raise ValueError(f"alltoallv: rank {rank} sends itself {layout[rank][1]} elements but "
                         f"expects {rlayout[rank][1]}")
    src = apart_blocks(src, layout, dst, rlayout, "alltoallv")
    # sizes differ per rank, so every rank selects by team size alone (size 0)
    return Call("alltoallv", src, dst, ReduceOp.SUM, 0, recvbuf, 0, layout, rlayout)


def gather(rank: int, size: int, sendbuf: Any, recvbuf: Any = None, root: int = 0) -> Call:
    check_root(root, size, "gather")
    if rank != root:
        src = as_array(sendbuf, what="sendbuf")
        return Call("gather", src, src, ReduceOp.SUM, root, None, src.nbytes * size)
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    if dst.size % size:
        raise ValueError(f"gather: recvbuf of {dst.size} elements is not {size} equal blocks")
    m = dst.size // size
    src = contribution(sendbuf, dst, (root * m, m), rank, "gather")
    return Call("gather", src, dst, ReduceOp.SUM, root, recvbuf, dst.nbytes)


def gatherv(rank: int, size: int, sendbuf: Any, recvbuf: Any = None, counts: Optional[Sequence[int]] = None,
            displs: Optional[Sequence[int]] = None, root: int = 0) -> Call:
    check_root(root, size, "gatherv")
    if rank != root:
        src = as_array(sendbuf, what="sendbuf")
        layout = None
        if counts is not None:
            layout = check_layout(counts, displs, None, size, "gatherv", "recvbuf")
            if layout[rank][1] != src.size:
                raise ValueError(f"gatherv: sendbuf holds {src.size} elements, counts[{rank}] is "
                                 f"{layout[rank][1]}")
        return Call("gatherv", src, src, ReduceOp.SUM, root, None, 0, layout)
    if counts is None:
        raise ValueError("gatherv: the root needs counts")
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    layout = check_layout(counts, displs, dst.size, size, "gatherv", "recvbuf")
    src = contribution(sendbuf, dst, layout[root], rank, "gatherv", layout)
    return Call("gatherv", src, dst, ReduceOp.SUM, root, recvbuf, 0, layout)


def scatter(rank: int, size: int, sendbuf: Any, recvbuf: Any, root: int = 0) -> Call:
    check_root(root, size, "scatter")
    if rank != root:
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        return Call("scatter", dst, dst, ReduceOp.SUM, root, recvbuf, dst.nbytes * size)
    src = as_array(sendbuf, what="sendbuf")
    if src.size % size:
        raise ValueError(f"scatter: sendbuf of {src.size} elements is not {size} equal blocks")
    m = src.size // size
    dst = own_output(recvbuf, src, (root * m, m), "scatter")
    return Call("scatter", src, dst, ReduceOp.SUM, root, recvbuf if recvbuf is not None else dst, src.nbytes)


def scatterv(rank: int, size: int, sendbuf: Any, recvbuf: Any, counts: Optional[Sequence[int]] = None,
             displs: Optional[Sequence[int]] = None, root: int = 0) -> Call:
    check_root(root, size, "scatterv")
    if rank != root:
        dst = as_array(recvbuf, writable=True, what="recvbuf")
        layout = None
        if counts is not None:
            layout = check_layout(counts, displs, None, size, "scatterv", "sendbuf", overlap=True)
            if layout[rank][1] != dst.size:
                raise ValueError(f"scatterv: recvbuf holds {dst.size} elements, counts[{rank}] is "
                                 f"{layout[rank][1]}")
        return Call("scatterv", dst, dst, ReduceOp.SUM, root, recvbuf, 0, layout)
    if counts is None:
        raise ValueError("scatterv: the root needs counts")
    src = as_array(sendbuf, what="sendbuf")
    layout = check_layout(counts, displs, src.size, size, "scatterv", "sendbuf", overlap=True)
    dst = own_output(recvbuf, src, layout[root], "scatterv", layout)
    return Call("scatterv", src, dst, ReduceOp.SUM, root, recvbuf if recvbuf is not None else dst, 0, layout)


# ---------------------------------------------------------------------------------- helpers
def apart(src: np.ndarray, dst: np.ndarray, coll: str, own: Optional[Tuple[int, int]] = None,
          blocks: Optional[Sequence[Tuple[int, int]]] = None) -> np.ndarray:
    """``src`` if it lies apart from what the call touches in ``dst``: the whole of ``dst``, or its
    ``blocks`` (offset, count) of a v-layout (``src`` may lie in their gaps); ``dst`` if it is the
    same memory as the whole of ``dst`` (in place, given as two objects: the algorithms know it as
    the same array); ``src`` if it is exactly the rank's block ``own`` = (offset, count) of ``dst``
    (a gathering collective's input in place). Any other overlap raises ``ValueError`` (MPI
    forbids it; the algorithms would read what they wrote). Symmetric: the scatters and the
    reduce-scatters pass the output as ``src`` and the input, whose blocks they read, as ``dst``."""
    if src is dst or (src.base is None and dst.base is None) or not np.may_share_memory(src, dst):
        return src  # (arrays that own their memory are apart: no address is looked up)
    lo = address(src) - address(dst)
    hi = lo + src.nbytes
    item = dst.itemsize
    if blocks is None and lo == 0 and src.nbytes == dst.nbytes and src.dtype == dst.dtype:
        return dst
    if own is not None and lo == own[0] * item and src.nbytes == own[1] * item:
        return src
    touched = ((0, dst.size),) if blocks is None else blocks
    for off, cnt in touched:
        if cnt and off * item < hi and lo < (off + cnt) * item:
            where = "this rank's block" if own is not None else "the same array"
            raise ValueError(f"{coll}: sendbuf and recvbuf overlap ({lo:+d} bytes apart); pass arrays "
                             f"apart, or {where} for in place")
    return src


def apart_blocks(src: np.ndarray, layout: Layout, dst: np.ndarray, rlayout: Layout, coll: str) -> np.ndarray:
    """An alltoallv's ``src`` if the blocks it reads (``layout``) and those it writes into ``dst``
    (``rlayout``) do not overlap; ``dst`` if the two are the same memory with the same blocks (in
    place). Else ``ValueError``, before anything is sent."""
    same = src is dst
    if not same and ((src.base is None and dst.base is None) or not np.may_share_memory(src, dst)):
        return src
    shift = 0 if same else address(src) - address(dst)
    if shift == 0 and src.nbytes == dst.nbytes and src.dtype == dst.dtype:
        if [tuple(b) for b in layout] != [tuple(b) for b in rlayout]:
            raise ValueError(f"{coll}: sendbuf and recvbuf are the same memory (in place) but their counts "
                             "or displacements differ; in place takes the same for both")
        return dst
    item = dst.itemsize
    reads = np.array([(o, o + c) for o, c in layout if c], np.int64).reshape(-1, 2) * item + shift
    writes = np.array([(o, o + c) for o, c in rlayout if c], np.int64).reshape(-1, 2) * item
    if ((reads[:, None, 0] < writes[None, :, 1]) & (writes[None, :, 0] < reads[:, None, 1])).any():
        raise ValueError(f"{coll}: blocks of sendbuf overlap blocks of recvbuf ({shift:+d} bytes apart); "
                         "pass arrays apart, or the same array with the same blocks for in place")
    return src


def elementwise(sendbuf: Any, recvbuf: Any, coll: str) -> tuple:
    """(src, dst, what wait() returns) of an elementwise collective; ``recvbuf=None``: in place."""
    if recvbuf is None:
        src = dst = as_array(sendbuf, writable=True, what="sendbuf (in place)")
        return src, dst, sendbuf
    src = as_array(sendbuf, what="sendbuf")
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ValueError(f"{coll}: sendbuf is {src.size} x {src.dtype}, recvbuf {dst.size} x "
                         f"{dst.dtype}; they must match")
    return apart(src, dst, coll), dst, recvbuf


def contribution(sendbuf: Any, dst: np.ndarray, block: Tuple[int, int], rank: int, coll: str,
                 layout: Optional[Layout] = None) -> np.ndarray:
    """This rank's input to a gathering collective: ``sendbuf``, or (``None``: in place) its
    ``block`` of ``dst`` (``layout``: the blocks of a v-collective, whose gaps ``sendbuf`` may lie in)."""
    off, cnt = block
    if sendbuf is None:
        return dst[off:off + cnt]
    src = as_array(sendbuf, what="sendbuf")
    if src.dtype != dst.dtype or src.size != cnt:
        raise ValueError(f"{coll}: sendbuf ({src.size} x {src.dtype}) must be rank {rank}'s "
                         f"block of recvbuf ({cnt} x {dst.dtype})")
    return apart(src, dst, coll, block, layout)


def own_output(recvbuf: Any, src: np.ndarray, block: Tuple[int, int], coll: str,
               layout: Optional[Layout] = None) -> np.ndarray:
    """The root's output of a scattering collective: ``recvbuf``, or (``None``: in place) its
    block of ``src`` (left where it is)."""
    off, cnt = block
    if recvbuf is None:
        return src[off:off + cnt]
    dst = as_array(recvbuf, writable=True, what="recvbuf")
    if src.dtype != dst.dtype or dst.size != cnt:
        raise ValueError(f"{coll}: recvbuf ({dst.size} x {dst.dtype}) must hold the root's block of "
                         f"sendbuf ({cnt} x {src.dtype})")
    apart(dst, src, coll, block, layout)  # (apart, or exactly its own block of sendbuf: in place)
    return dst


def check_layout(counts: Sequence[int], displs: Optional[Sequence[int]], room: Optional[int], n: int,
                 coll: str, what: str, overlap: bool = False) -> Layout:
    """Checked ``((displ, count), ...)`` per rank of a v-collective's buffer of ``room``
    elements (None: not known on this rank). Receive blocks may not overlap (as in MPI)."""
    try:
        counts = [int(c) for c in counts]
        displs = None if displs is None else [int(d) for d in displs]
    except (TypeError, ValueError):
        raise TypeError(f"{coll}: counts and displs must be sequences of integers") from None
    if len(counts) != n or (displs is not None and len(displs) != n):
        raise ValueError(f"{coll}: counts and displs need one entry per rank ({n}), got {len(counts)} "
                         f"and {'none' if displs is None else len(displs)}")
    if displs is None:
        displs = list(itertools.accumulate([0] + counts[:-1]))
    for r, (d, c) in enumerate(zip(displs, counts)):
        if c < 0 or d < 0 or (room is not None and d + c > room):
            raise ValueError(f"{coll}: block of rank {r} ({c} elements at {d}) does not fit {what} of "
                             f"{room} elements")
    if not overlap:
        end = 0
        for d, c in sorted((d, c) for d, c in zip(displs, counts) if c):
            if d < end:
                raise ValueError(f"{coll}: blocks of {what} overlap at element {d}")
            end = d + c
    return tuple(zip(displs, counts))


def check_root(root: int, size: int, coll: str) -> None:
    if not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"{coll}: root {root!r} is not a rank of a team of {size}")


def span(layout: Sequence[Tuple[int, int]]) -> int:
    """Elements covered by a layout's blocks (their total)."""
    return sum(c for _, c in layout)
