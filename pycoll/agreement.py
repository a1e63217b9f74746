"""The agreement check of collectives that run off the shared segment.

Ranks that call different collectives, or the same one with a count, dtype, op or root that must
agree and does not, would otherwise exchange messages that match by key and size alone: a wrong
result, silently, wherever the byte sizes happen to agree (float32 against int32, SUM against MAX).
The segment's collectives sign every call in the segment (``native/shm.c``); the others, on MPI,
TCP, UCX or several hosts, are checked here: before a checked call moves any data its ranks
allgather a fingerprint of it (:func:`fingerprint`), and every rank raises
:class:`pycoll.MismatchError` naming each rank's call when they differ.

Which calls are checked (``PYCOLL_CHECK``): ``auto``, the first :data:`CHECK_FIRST` collectives of
each team (and uses of each tag) and then those whose number is a power of two, so that a mistake
in a script is caught at once and a late one soon, at a cost that vanishes over a long run; ``all``,
every call; ``off``, none. The choice depends only on the collective's message key, which every
rank gives alike, so the ranks always agree on which calls carry the extra exchange; but the
v-collectives (:data:`ALWAYS`) and a rank's rejection of a call (under every mode) are always
checked. (Ranks of which some call a v-collective and others another, unchecked one, at the same
place then wait on each other until the timeout: a late error, never a silent one.)
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

import numpy as np

from pycoll import algorithms
from pycoll.calls import REJECTED, Call
from pycoll.collectives import COLLECTIVES
from pycoll.dtypes import DTYPE_CODES
from pycoll.errors import MismatchError
from pycoll.ops import ReduceOp
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import COMPLETED, FINISHED, Task

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.planner import Planner

#: Collectives checked before the check thins out to powers of two (``PYCOLL_CHECK=auto``).
CHECK_FIRST = 8
#: Words (uint64) of a fingerprint: six that every rank gives alike, then the two :func:`flows`.
WORDS = 8
FLOWS = 6
#: The allgather that exchanges the fingerprints (log2(n) messages, any team size).
EXCHANGE = "bruck"

_COLLS = list(COLLECTIVES)
_NAMES = {code: str(dt) for dt, code in DTYPE_CODES.items()}
_OPS = list(ReduceOp)
_NONE = 0xFFFFFFFF
#: Collectives checked on every call off the segment (``PYCOLL_CHECK=auto``): the v-forms, whose
#: counts are each rank's own data, which a rank may reject (a root's counts,
#: :meth:`pycoll.planner.Planner.reject`) while its peers post the call; only the check tells them
#: at once.
ALWAYS = frozenset(c.name for c in COLLECTIVES.values() if c.vector)


def due(key: tuple, mode: str) -> bool:
    """Whether the collective of message key ``key`` is checked under ``PYCOLL_CHECK=mode``."""
    if mode == "off":
        return False
    if mode == "all":
        return True
    k = key[1] if key[0] == "c" else key[2]
    return k < CHECK_FIRST or not (k & (k - 1))


def on_segment(coll: str, name: str) -> bool:
    """Whether algorithm ``name`` of ``coll`` runs on the shared segment (which signs its calls)."""
    return name == "shm" or bool(getattr(algorithms.MODULES.get(coll, {}).get(name), "SEGMENT", False))


def weights(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """A pseudo-random odd 64-bit weight for each block sent from rank ``src`` to rank ``dst``
    (splitmix64 of the pair): see :func:`flows`."""
    z = (src.astype(np.uint64) << np.uint64(32) | dst.astype(np.uint64)) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31)) | np.uint64(1)


def flows(call: Call, rank: int, size: int) -> Tuple[int, int]:
    """``(sent, received)``: the weighted sums (mod 2**64) of the sizes of the blocks this rank
    sends to and expects from each other rank in a gatherv, scatterv or alltoallv, whose counts
    no rank sees whole (a root's counts; each rank's row of the alltoallv matrix). Every block
    one rank sends is the size its receiver expects exactly when the sums of ``sent`` and of
    ``received`` over the ranks are equal (but with a chance of 2**-64): a check from what each
    rank knows, in two words."""
    coll, root = call.coll, call.root
    others = np.array([r for r in range(size) if r != rank], np.int64)
    me = np.full(len(others), rank, np.int64)
    if coll == "alltoallv" and call.layout is not None and call.rlayout is not None:
        out = np.array([call.layout[r][1] for r in others], np.uint64) * weights(me, others)
        back = np.array([call.rlayout[r][1] for r in others], np.uint64) * weights(others, me)
        return int(out.sum(dtype=np.uint64)), int(back.sum(dtype=np.uint64))
    if coll not in ("gatherv", "scatterv") or size < 2:
        return 0, 0
    if rank != root:
        w = int(weights(np.array([rank if coll == "gatherv" else root]),
                        np.array([root if coll == "gatherv" else rank]))[0])
        own = call.src.size if coll == "gatherv" else call.dst.size
        return ((own * w) % (1 << 64), 0) if coll == "gatherv" else (0, (own * w) % (1 << 64))
    if call.layout is None:
        return 0, 0
    counts = np.array([call.layout[r][1] for r in others], np.uint64)
    if coll == "gatherv":
        return 0, int((counts * weights(others, me)).sum(dtype=np.uint64))
    return int((counts * weights(me, others)).sum(dtype=np.uint64)), 0


def fingerprint(call: Call, name: str, rank: int = 0, size: int = 1) -> np.ndarray:
    """What must agree across ranks of ``call`` run by algorithm ``name`` (on rank ``rank`` of
    ``size``): collective, dtype, op, root, count (or the digest of the v-forms' counts),
    algorithm; and the :func:`flows` of the blocks whose sizes only their two ends know."""
    coll = call.coll
    row = COLLECTIVES.get(coll)
    agreed = row.agreed if row is not None else ""
    buf = call.dst if agreed == "dst" else call.src
    count: int = _NONE
    if agreed and row is not None and row.agreed_count == "size":
        count = buf.size
    elif row is not None and row.agreed_count == "counts" and call.layout is not None:
        count = zlib.crc32(repr([c for _, c in call.layout]).encode()) | 1 << 32
    return np.array([_COLLS.index(coll) if coll in _COLLS else 0xFF,
                     DTYPE_CODES.get(buf.dtype, 0x100 | buf.dtype.itemsize) if agreed else 0xFF,
                     _OPS.index(call.op) if row is not None and row.reduces else 0xFF,
                     call.root if (row is not None and row.rooted) or call.root == REJECTED else _NONE,
                     count, zlib.crc32(name.encode()), *flows(call, rank, size)], np.uint64)


def describe(rec: np.ndarray) -> str:
    """A rank's call as its fingerprint says it: ``allreduce 100 x float32 sum``, ``bcast 8 x int64
    root 1``, ``allgatherv x float32 counts #1a2b3c4d``, ``barrier``."""
    coll, dtype, op, root, count = (int(x) for x in rec[:5])
    if root == REJECTED:
        return "a call it rejected (its arguments failed its own checks)"
    text = _COLLS[coll] if coll < len(_COLLS) else f"collective {coll}"
    if dtype != 0xFF:
        kind = _NAMES.get(dtype, f"{dtype & 0xFF}-byte elements" if dtype >> 8 == 1 else f"dtype {dtype}")
        if count == _NONE:
            text += f" x {kind}"
        elif count >> 32:
            text += f" x {kind} counts #{count & _NONE:08x}"
        else:
            text += f" {count} x {kind}"
    if op != 0xFF:
        text += f" {_OPS[op].value}" if op < len(_OPS) else f" op {op}"
    if root != _NONE:
        text += f" root {root}"
    return text


def disagreement(recs: np.ndarray, mine: str) -> Optional[str]:
    """None when every rank's fingerprint (a row of ``recs``) is the same; else each rank's call
    side by side (``mine``: this rank's algorithm, named where the algorithms differ)."""
    same = (recs[:, :FLOWS] == recs[0, :FLOWS]).all()
    if same and recs[:, FLOWS].sum(dtype=np.uint64) == recs[:, FLOWS + 1].sum(dtype=np.uint64):
        return None
    if same:
        return (f"the ranks disagree on the sizes of the blocks (the counts) of this {describe(recs[0])}: "
                "a rank sends another a block of a size that one does not expect")
    algos = len({int(r[5]) for r in recs}) > 1
    shown: List[str] = []
    for r, rec in enumerate(recs[:16]):
        shown.append(f"rank {r}: {describe(rec)}" + (" (another algorithm)" if algos and rec[5] != recs[0][5]
                                                     else ""))
    more = f"; and {len(recs) - 16} more" if len(recs) > 16 else ""
    return ("the ranks called different collectives, or the same one with arguments that must agree: "
            + "; ".join(shown) + more + (f" (this rank's algorithm: {mine})" if algos else ""))


class CheckedCall(Schedule):
    """A collective preceded by the exchange of its ranks' fingerprints: the collective starts
    only once they agree; otherwise the schedule fails with MismatchError on every rank. No
    dependency edge ties the two (the collective may be kept and run again on its own: a pooled or
    persistent task), and both are let go when the schedule finishes."""

    takes_credit = False
    polled = False

    def __init__(self, exchange: Task, task: Task, compare: Callable[[], Optional[str]], name: str) -> None:
        super().__init__(name=name)
        self.add(exchange)
        self.add(task)
        self.exchange, self.task, self.compare = exchange, task, compare

    def post(self) -> None:
        self._n_done = 0
        prio = self.effective_priority
        for task in self.tasks:
            task.effective_priority = prio if task.priority is None else task.priority
        self.exchange.activate(self.ctx)

    def child_finished(self, child: Task) -> None:
        if child is self.exchange and child.state is COMPLETED and self.state not in FINISHED:
            problem = self.compare()
            if problem is not None:
                self.fail(MismatchError(problem))
            else:
                self._n_done += 1
                self.task.activate(self.ctx)
        else:
            super().child_finished(child)
        if self.state in FINISHED:
            for task in self.tasks:
                if task.state in FINISHED:
                    task.parent = None


def checked_call(planner: Planner, task: Task, call: Call, key: tuple, name: str) -> Task:
    """``task`` (collective ``call`` by algorithm ``name``, message key ``key``) preceded by the
    fingerprint exchange, as one :class:`CheckedCall` to submit in its place."""
    team = planner.team
    n = team.size
    mine = fingerprint(call, name, team.rank, n)
    recs = np.zeros((n, WORDS), np.uint64)
    exchange_call = Call("allgather", mine, recs.reshape(-1), ReduceOp.SUM, 0, None, recs.nbytes)
    exchange_key = (*key, "agree")
    args = planner.args(exchange_call, exchange_key, EXCHANGE, {})
    exchange = algorithms.get("allgather", EXCHANGE)(args)
    exchange.credit = 0
    task.parent = None  # a pooled or persistent task: let go by the schedule of its last run
    return CheckedCall(exchange, task, lambda: disagreement(recs, name), name=f"{task.name} (checked)")
