"""The agreement check of collectives that run off the shared segment.

Ranks that call different collectives, or the same one with a count, dtype, op or root that must
agree and does not, would otherwise exchange messages that match by key and size alone: a wrong
result, silently, wherever the byte sizes happen to agree (float32 against int32, SUM against MAX).
The segment's collectives sign every call in the segment (``native/shm.c``); the others, on MPI,
TCP, UCX, the one-host point to point or several hosts, are checked here, on every call, two ways:

* **Marks** (every call, at no measurable cost). Every message of a collective carries its call's
  mark (:class:`pycoll.tl.base.Mark`, 32 bytes ahead of the payload): what :func:`mark_fields`
  packs of the call (collective, count or the digest of the v-counts, dtype, op, root,
  algorithm) and a word of history, and every receive compares it with its own before it takes
  the payload. The history word of an untagged collective folds in every marked untagged
  collective the team posted before it (:func:`history`), so that a call that differed where no
  message told the ranks apart (a bcast that each rank took itself the root of) is caught at the
  next message between them; a tagged one's is its key. A receive whose mark differs fails its
  collective with :class:`pycoll.MismatchError` naming both calls (:func:`explain`); the team then
  takes no more calls on that rank, and the others learn it no later than at their next call (see
  :meth:`pycoll.planner.Planner.judge`): ranks whose part sent and received nothing that tells
  (a bcast's root) return, and raise at their next call.
* **The exchange** (before the call moves any data): the ranks allgather a fingerprint of it
  (:func:`fingerprint`) and every rank raises MismatchError naming each rank's call when they
  differ; nothing was sent, and the team goes on. It runs for the v-collectives (:data:`ALWAYS`:
  each rank knows its own blocks only, which the fingerprint's flows compare), for a rank's
  rejection of a call, and under ``PYCOLL_CHECK=all`` for every call.

``PYCOLL_CHECK``: ``on`` (the default; ``auto`` is an older name for it) as above; ``all``, the
exchange too before every call; ``off``, no marks and the exchange only for rejections. The choice
depends only on the collective and its message key, which every rank gives alike, so the ranks
always agree on which calls carry the exchange. (Ranks of which some call a v-collective and
others another collective at the same place then wait on each other until the timeout: a late
error, never a silent one.)
"""

from __future__ import annotations

import logging
import struct
import threading
import time
import zlib
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from pycoll import algorithms
from pycoll.calls import REJECTED, Call
from pycoll.collectives import COLLECTIVES
from pycoll.dtypes import DTYPE_CODES
from pycoll.errors import MismatchError, ThreadError
from pycoll.ops import ReduceOp
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import COMPLETED, FINISHED, Task
from pycoll.tl.base import key_hash
from pycoll.tl.marks import Mark

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.planner import Planner

log = logging.getLogger("pycoll")
#: Seconds a collective in flight goes on after the news that the team's calls went out of step
#: (or that a peer left, :mod:`pycoll.lost`), taking in what the peers sent before.
GRACE_S = 0.05

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


def due(coll: str, mode: str) -> bool:
    """Whether collective ``coll`` runs behind the exchange under ``PYCOLL_CHECK=mode`` (a
    rejection does under every mode)."""
    return mode == "all" or (mode == "on" and coll in ALWAYS)


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
    return np.array([*fields(call, name), *flows(call, rank, size)], np.uint64)


def fields(call: Call, name: str) -> Tuple[int, int, int, int, int, int]:
    """The first :data:`FLOWS` words of a fingerprint: collective, dtype, op, root, count (or the
    digest of the v-forms' counts), algorithm (0xFF..: none)."""
    coll = call.coll
    row = COLLECTIVES.get(coll)
    agreed = row.agreed if row is not None else ""
    buf = call.dst if agreed == "dst" else call.src
    count: int = _NONE
    if agreed and row is not None and row.agreed_count == "size":
        count = buf.size
    elif row is not None and row.agreed_count == "counts" and call.layout is not None:
        count = zlib.crc32(repr([c for _, c in call.layout]).encode()) | 1 << 32
    return (_COLLS.index(coll) if coll in _COLLS else 0xFF,
            DTYPE_CODES.get(buf.dtype, 0x100 | buf.dtype.itemsize) if agreed else 0xFF,
            _OPS.index(call.op) if row is not None and row.reduces else 0xFF,
            call.root if (row is not None and row.rooted) or call.root == REJECTED else _NONE,
            count, zlib.crc32(name.encode()))


# ---------------------------------------------------------------------------------------- marks
#: Seconds a marked collective waits before its rank asks the peers for their marks of it.
ASK_AFTER_S = 1.0
#: A mark's fields: magic, collective, op, dtype, root, algorithm (crc32 of its name), count.
_MARK = struct.Struct("<4sBBHIIQ")
_MARK_MAGIC = b"PCMK"
#: The multiplier of :func:`history` (odd: a step of it loses nothing of the history before).
_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def mark_fields(call: Call, name: str) -> bytes:
    """The fields of the mark that the messages of ``call`` by algorithm ``name`` carry (24 bytes;
    a :class:`pycoll.tl.base.Mark` adds the history word)."""
    coll, dtype, op, root, count, algo = fields(call, name)
    return _MARK.pack(_MARK_MAGIC, coll & 0xFF, op & 0xFF, dtype & 0xFFFF, root & 0xFFFFFFFF, algo, count)


def history(before: int, fid: int, seq: int) -> int:
    """The history word of untagged collective ``seq`` (mark digest ``fid``; 0 for a call checked
    by the exchange, which compares the calls itself) after the history ``before``."""
    return (before * _MIX + fid + seq) & _MASK


class Marks:
    """The marks of one team's collectives: made for each new collective (:meth:`make`), stamped
    with their history as each call takes its key (:meth:`stamp`), and the judge of a receive that
    finds another mark (:meth:`judge`). ``mode`` is ``PYCOLL_CHECK``."""

    def __init__(self, planner: Planner, mode: str) -> None:
        self.planner = planner
        self.mode = mode
        #: The collectives that run behind the exchange under ``mode`` (:func:`due`): the planner
        #: asks here at every post.
        self.exchanged = frozenset(c for c in COLLECTIVES if due(c, mode))
        #: Whether the team's collectives carry marks (not under ``off``, nor on a team of one).
        self.on = mode != "off" and planner.team.size > 1
        self.history = 0  # of the marked untagged collectives posted (see history())
        #: What tells the peers that this rank found the ranks' calls out of step, with the error
        #: they are to raise (set by the bootstrap: the segment, the store, an MPI communicator,
        #: the other in-process ranks; see :meth:`judge`), or None.
        self.news: Optional[Callable[[MismatchError], None]] = None
        #: Where the team has them: a cheap look for a peer's news at every post, which takes it
        #: and says whether the team takes no more calls (``pending``, where such a look costs
        #: little), taking it (``take``), and letting it go when the team closes (``close_news``);
        #: see :mod:`pycoll.news`.
        self.pending: Optional[Callable[[], bool]] = None
        self.take: Optional[Callable[[], bool]] = None
        self.close_news: Optional[Callable[[], None]] = None
        #: ``[ident]`` of the thread that posts the team's untagged collectives now (see
        #: :meth:`posting`), and its name.
        self.poster = [0]
        self._poster_name = ""
        self._waiting: Dict[tuple, float] = {}  # (channel, key) of a marked collective -> since when
        self._asked: Set[tuple] = set()  # (see strays)

    def make(self, task: Task, channel: Any, call: Call, name: str) -> Optional[Mark]:
        """Give a new collective's task (built for ``call`` by algorithm ``name``; its messages go
        on ``channel``) the mark its messages carry, if the team marks its calls and the algorithm
        sends messages (the segment's do not); returns it."""
        if not self.on or on_segment(call.coll, name):
            return None
        task.mark = channel.mark = mark = Mark(mark_fields(call, name), self)
        return mark

    def stamp(self, mark: Mark, key: tuple, coll: str) -> None:
        """Write the history word of the call of collective ``coll`` that takes message key ``key``
        into its task's mark, as it takes the key: an untagged one's folds in the team's history
        (:func:`history`; one behind the exchange, which compares the calls itself, folds in its
        number only; ``coll`` empty: such a call), a tagged one's is its key."""
        if key[0] == "c":  # (history() inline: a call's fast path)
            fid = 0 if not coll or coll in self.exchanged else mark.fid
            self.history = h = (self.history * _MIX + fid + key[1]) & _MASK
            mark.words[3] = h  # (Mark.stamp inline)
            mark.blob = mark.head + h.to_bytes(8, "little")
        else:
            mark.stamp(key_hash(key))

    def stamper(self, mark: Mark, coll: str) -> Callable[[int], None]:
        """:meth:`stamp` for the untagged calls of collective ``coll`` whose task keeps ``mark`` (an
        express lane's runs): what stays the same is worked out once; ``stamper(mark, coll)(k)``
        stamps call number ``k``."""
        fid = 0 if not coll or coll in self.exchanged else mark.fid
        words, head = mark.words, mark.head

        def stamp(k: int) -> None:
            self.history = h = (self.history * _MIX + fid + k) & _MASK
            words[3] = h
            mark.blob = head + h.to_bytes(8, "little")

        return stamp

    def judge(self, mark: Mark, peer: int, theirs: bytes, nbytes: int, expected: int) -> MismatchError:
        """The error of a receive from ``peer`` that found ``theirs`` where its mark ``mark``
        should be (or a payload of ``nbytes`` where ``expected``): a :class:`MismatchError`
        naming both calls (:func:`explain`). The ranks' calls are out of step from here on: this
        rank's team takes no more calls (each raises MismatchError), its other collectives in
        flight fail, and :attr:`news` tells the peers, which learn it no later than at their next
        call (called by a transport, in the engine, under its lock)."""
        team = self.planner.team
        text = explain(mark.blob, theirs, team.rank, peer, nbytes, expected)
        return self.out_of_step(MismatchError(f"{team.name}: {text}"), text)

    def posting(self) -> None:
        """The calling thread posts an untagged collective, and the last one was another thread's
        (or none): it becomes the team's poster, unless an untagged collective of the team is in
        flight still; then the posts of two threads may interleave, in another order on each
        rank, and the team's calls are out of step: :class:`~pycoll.errors.ThreadError`, raised
        here and on every other rank (:meth:`out_of_step`)."""
        planner = self.planner
        ident, name = threading.get_ident(), threading.current_thread().name
        if self.poster[0] and any(_untagged(task) for task in planner.ctx.owned((planner,))):
            team = planner.team
            text = (f"threads {self._poster_name!r} and {name!r} of rank {team.rank} posted untagged "
                    "collectives on this team at once (their order, which matches them across ranks, "
                    "may differ from rank to rank): give each thread's collectives a tag=, or each "
                    "thread a team of its own, or post from one thread at a time")
            raise self.out_of_step(ThreadError(f"{team.name}: {text}"), text)
        self.poster[0], self._poster_name = ident, name

    def out_of_step(self, error: MismatchError, text: str) -> MismatchError:
        """The team's calls went out of step on this rank (``error``, ``text`` says why): it takes
        no more calls (each raises an error of ``error``'s type), its collectives in flight fail
        with ``error``, and :attr:`news` tells the peers. Returns ``error``."""
        planner = self.planner
        team = planner.team
        if planner.revoked is None:
            after = type(error)(f"{team.name}: the ranks' calls went out of step: rank {team.rank} found "
                                f"that {text}; every later call on this team raises this error: close it "
                                "and make a new one")
            planner.revoked = after
            planner.ctx.fail_owned((planner,), error)  # (those in flight: this one too)
            news = self.news
            if news is not None:
                try:
                    news(after)
                except Exception:  # noqa: BLE001 - the error this rank raises matters more
                    log.warning("pycoll: telling the peers of a mismatch failed", exc_info=True)
        return error

    def strays(self) -> bool:
        """The engine's watch while it waits: a marked collective of this team in flight whose
        transport holds a message of it (another step, a peer's other collective or arguments)
        that no receive took and that carries another mark fails as a receive that found it would
        (:meth:`judge`); a peer that called something else here is named within ``WATCH_S``
        instead of both waiting until the timeout. One that waits :data:`ASK_AFTER_S` asks the
        peers for their marks of it (:mod:`pycoll.status`): ranks whose calls differ so that no
        message ever flows (each took itself for a reduce's root) are named too. False: stop (the
        team is out of step or closed).

        The engine's watches run in whichever thread waits, the progress thread's included, and
        without the engine's lock: the transport's messages and the judgement are the engine's,
        so they are taken under its lock here; the peers are asked outside it (an answer may take
        :data:`pycoll.status.ASK_S`, and the thread that posts must not wait on it)."""
        planner = self.planner
        if planner.revoked is not None:
            return False
        lock = planner.ctx.lock
        with lock:
            found, ask = self._stray()
            if found is not None:
                self.judge(*found, found[3])
                return False
        for mark, channel in ask:
            theirs = self._ask(channel)
            if theirs is not None:
                with lock:
                    if planner.revoked is None:
                        self.judge(mark, *theirs, theirs[2])
                return False
        return True

    def _stray(self) -> Tuple[Optional[tuple], List[tuple]]:
        """:meth:`strays`' look at the transport, under the engine's lock: ``(found, ask)``, the
        first message of a peer's other call (``(mark, peer, theirs, nbytes)``, or None) and the
        ``(mark, channel)`` of the collectives that waited long enough to ask the peers about."""
        stray = self.planner.team.transport.stray
        now = time.monotonic()
        waiting: Dict[tuple, float] = {}
        ask: List[tuple] = []
        for task in self.planner.ctx.in_progress():
            channel = _marked_channel(task, self)
            if channel is None or (id(channel), channel.key) in waiting:
                continue
            place = (id(channel), channel.key)
            waiting[place] = since = self._waiting.get(place, now)
            found = stray(channel.key, channel.mark)
            if found is not None:
                return (channel.mark, *found), []
            if now - since >= ASK_AFTER_S and place not in self._asked:
                self._asked.add(place)
                ask.append((channel.mark, channel))
        self._waiting = waiting
        self._asked &= set(waiting)
        return None, ask

    def _ask(self, channel: Any) -> Optional[Tuple[int, bytes, int]]:
        """A peer whose mark of the collective on ``channel`` differs from this rank's, asked
        (``(peer, its mark, 0)``), or None (every peer that answered agrees, or has not posted it
        or finished it, or the team cannot ask)."""
        asked = self.planner.peer_status
        key = channel.key[:2] if channel.key[0] == "c" else channel.key[:3]
        if asked is None:
            return None
        for peer, answer in sorted(asked.ask(key).items()):
            if answer is not None and answer["mark"] and answer["mark"] != channel.mark.blob:
                return peer, answer["mark"], 0
        return None

    def closed(self) -> None:
        """The team closes: no more news."""
        if self.close_news is not None:
            self.close_news()
        self.news = self.pending = self.take = self.close_news = None

    def learned(self, error: MismatchError) -> None:
        """A peer found the ranks' calls out of step (its :attr:`news` reached this rank): the team
        takes no more calls (each raises ``error``'s text), and its collectives in flight fail once
        the engine took in, for :data:`GRACE_S`, what the peers sent before (the peer found it at a
        later call: one it finished may still be finishing here, and finishes)."""
        planner = self.planner
        if planner.revoked is not None:
            return
        planner.revoked = error
        ctx, until = planner.ctx, time.monotonic() + GRACE_S

        def fail_late() -> bool:
            if time.monotonic() < until:
                return True
            ctx.fail_owned((planner,), error)
            return False

        ctx.watch(fail_late)


def _untagged(task: Task) -> bool:
    """Whether ``task`` is an untagged collective (or holds one: a partitioned schedule's key)."""
    key = getattr(getattr(getattr(task, "args", None), "channel", None), "key", None)
    key = key if key is not None else getattr(task, "key", None)
    return isinstance(key, tuple) and bool(key) and key[0] == "c"


def _marked_channel(task: Task, marks: Marks) -> Any:
    """The channel of the marked collective of ``marks``'s team that ``task`` is (or is inside),
    or None."""
    t: Optional[Task] = task
    while t is not None:
        channel = getattr(getattr(t, "args", None), "channel", None)
        if channel is not None and channel.mark is not None and channel.mark.owner is marks:
            return channel
        t = t.parent
    return None


def _describe_mark(mark: bytes) -> str:
    magic, coll, op, dtype, root, algo, count = _MARK.unpack_from(mark)
    rec = np.array([coll if coll != 0xFF else 0xFF, dtype, op, root, count], np.uint64)
    return describe(rec)


def explain(mine: bytes, theirs: bytes, rank: int, peer: int, nbytes: int, expected: int) -> str:
    """Why a receive of rank ``rank`` from ``peer`` failed its mark check: this rank's mark
    ``mine``, the bytes ``theirs`` where the peer's mark was (fewer: its message was shorter;
    none: a longer message that the transport did not land), the payload bytes that came
    (``nbytes``; -1: more than fit) and were expected."""
    me = _describe_mark(mine)
    if nbytes < 0 and (len(theirs) < _MARK.size + 8 or theirs[:4] != _MARK_MAGIC or theirs == mine):
        # (a message longer than this call's, whose mark did not land: the transport dropped it)
        return (f"rank {peer}'s message for this collective is longer than this rank (rank {rank}: {me}) "
                "expects: the ranks called different collectives, or the same one with other counts or "
                "dtypes")
    if len(theirs) < _MARK.size + 8 or theirs[:4] != _MARK_MAGIC:
        return (f"rank {peer}'s message for this collective carries no call mark where this rank (rank "
                f"{rank}: {me}) expects one: it called another collective here (or a point-to-point "
                "send), or its PYCOLL_CHECK differs from this rank's")
    them = _describe_mark(theirs)
    if theirs[:_MARK.size] != mine[:_MARK.size]:
        algos = _MARK.unpack_from(theirs)[5] != _MARK.unpack_from(mine)[5]
        calls = sorted([(rank, me + (" (this rank)" if not algos else " (this rank's algorithm)")),
                        (peer, them + (" (another algorithm)" if algos else ""))])
        return ("the ranks called different collectives, or the same one with arguments that must agree: "
                + "; ".join(f"rank {r}: {text}" for r, text in calls))
    if theirs[_MARK.size:] != mine[_MARK.size:]:
        return (f"rank {peer} and this rank (rank {rank}) agree on this call ({me}) but not on the calls "
                "before it on this team: an earlier collective was called on some ranks and not on others, "
                "or with arguments that must agree and did not, where no message told the ranks apart")
    got = "more" if nbytes < 0 else f"{nbytes} B"
    return (f"the ranks disagree on the sizes of the blocks (the counts) of this {me}: rank {peer} sent "
            f"rank {rank} {got} where it expects {expected} B")


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
