"""What every algorithm gets: the collective's arguments and a channel to its peers.

An algorithm is a function ``build(args) -> Task`` in its own module (what the module declares:
:mod:`pycoll.algorithms`). It reaches peers only through ``args.channel`` (``isend``/``irecv`` of
byte buffers keyed by a step number), which the team binds to its transport; it never imports a
transport. Small, latency-bound algorithms are one :class:`StepTask` (a resumable state machine
written as a generator, like UCC's TL algorithms); bandwidth-bound ones are schedules of
send/receive/reduce tasks, pipelined over fragments.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Generator, Hashable, List, Optional, Sequence, Tuple

import numpy as np

from pycoll.buffers import scratch_array
from pycoll.errors import CanceledError
from pycoll.ops import ReduceOp, copy_into, finish_avg, reduce_into
from pycoll.tasks.task import COMPLETED, IN_PROGRESS, NOT_READY, Task
from pycoll.tl.base import Channel


@dataclass
class CollArgs:
    """Arguments of one collective on one rank, after validation."""

    coll: str
    rank: int
    size: int
    channel: Channel
    src: np.ndarray  # typed 1-D view; the same array as dst when in place
    dst: np.ndarray
    op: ReduceOp = ReduceOp.SUM
    root: int = 0
    name: str = ""
    options: dict = field(default_factory=dict)
    #: The team's node-shared segment when all its ranks share a host (else None).
    shared: Any = None
    #: Block collectives: ``layout[r] = (offset, count)`` (elements) of rank r's block in the
    #: *whole* buffer: dst of allgather(v)/gather(v), src of reduce_scatter(v)/scatter(v), src of
    #: alltoall(v) (the block sent to r). Equal blocks for the non-v forms. None elsewhere.
    layout: Optional[Sequence[Tuple[int, int]]] = None
    #: alltoall(v) only: ``rlayout[r]`` is the block of dst that receives rank r's data.
    rlayout: Optional[Sequence[Tuple[int, int]]] = None
    #: The message key of a tagged collective (the same on every rank), from which hierarchical
    #: algorithms derive the tags of their levels; None for untagged collectives.
    tag: Optional[Hashable] = None
    #: For the hierarchical algorithms: which node every rank of the team is on (a
    #: :class:`pycoll.topology.Topology`, or None), and the sub-teams they build their levels on as
    #: collectives (``sub.task(coll, *args, tag=..., algorithm=...)``, ``sub.rank``, ``sub.size``;
    #: None when the team is not split into nodes): the ranks of this rank's node, the ranks with
    #: this rank's index on every node, and the node leaders (None on the other ranks).
    topology: Any = None
    node_team: Any = None
    rail_team: Any = None
    leaders_team: Any = None
    #: Whether the collective's messages carry its call's mark (see :mod:`pycoll.agreement`): then
    #: a rank with nothing to move still exchanges its (empty) messages, so that a peer that has
    #: something learns that their calls differ instead of waiting for it.
    marked: bool = False

    @property
    def in_place(self) -> bool:
        return self.src is self.dst

    @property
    def count(self) -> int:
        return self.dst.size

    @property
    def nbytes(self) -> int:
        return self.dst.nbytes


def equal_layout(m: int, n: int) -> List[Tuple[int, int]]:
    """The layout of ``n`` blocks of ``m`` elements each, back to back."""
    return [(i * m, m) for i in range(n)]


def is_packed(layout: Sequence[Tuple[int, int]]) -> bool:
    """Whether the blocks lie back to back in rank order from offset 0 (so a range of ranks'
    blocks is one contiguous slice)."""
    end = 0
    for off, cnt in layout:
        if off != end:
            return False
        end += cnt
    return True


def block_bounds(count: int, nblocks: int) -> List[int]:
    """Offsets of ``nblocks`` near-equal blocks of ``count`` elements (``nblocks + 1`` entries);
    the first ``count % nblocks`` blocks hold one element more."""
    base, extra = divmod(count, nblocks)
    bounds = [0]
    for b in range(nblocks):
        bounds.append(bounds[-1] + base + (1 if b < extra else 0))
    return bounds


_BYTE = np.dtype(np.uint8)


def as_wire(arr: np.ndarray) -> np.ndarray:
    """The bytes of a typed view, as the transports move them."""
    return arr if arr.dtype is _BYTE else arr.view(_BYTE)  # (``is``: a dtype compared with == is slow)


Waitable = Sequence[Any]

#: The empty "go" message a rank that stands in for folded-out ranks (recursive doubling's proxies,
#: k-nomial's) sends them first. Its only use is to start them: a folded-out rank sends first but
#: would otherwise receive nothing before it did, so under a credit limit no peer's message could
#: start it (the engine starts a credit-blocked collective when a peer's message for it arrives).
GO = np.empty(0, np.uint8)
GO_SINK = np.empty(0, np.uint8)
_monotonic = time.monotonic


#: What a pooled collective's arguments point at between calls (see :meth:`Task.unbind`).
UNBOUND = np.empty(0, np.uint8)


def rebind_args(args: CollArgs, src: np.ndarray, dst: np.ndarray, key: tuple) -> None:
    """Point a collective's arguments at new buffers (same shape) and a new message key."""
    args.src = src
    args.dst = dst
    args.channel.rekey(key)


class StepTask(Task):
    """A collective written as a generator: ``run()`` yields lists of transport requests and is
    resumed when all of them are done; returning completes the task.

    This is UCC's resumable per-algorithm state machine, with Python keeping the state. A finished
    StepTask can be reused for another call of the same shape (:meth:`rebind`), keeping its
    scratch buffers (fresh large buffers cost page faults on every call).
    """

    __slots__ = ("args", "_gen", "_wait", "_scratch", "scratch_bytes")

    #: Whether this rank's first move in the collective is a send (then it takes credit; a rank
    #: that starts by receiving does not: see Team._unit). Algorithms set it per rank.
    sends_first = True

    def __init__(self, args: CollArgs, name: Optional[str] = None) -> None:
        super().__init__(name or args.name, nbytes=args.nbytes)
        self.args = args
        self._gen: Optional[Generator[Waitable, None, None]] = None
        self._wait: Waitable = ()
        self._scratch: List[np.ndarray] = []
        self.scratch_bytes = 0

    def scratch(self, i: int, like: np.ndarray) -> np.ndarray:
        """Scratch buffer ``i`` shaped like ``like``, kept across calls."""
        while len(self._scratch) <= i:
            self._scratch.append(np.empty(0, like.dtype))
        buf = self._scratch[i]
        if buf.size < like.size or buf.dtype != like.dtype:
            self.scratch_bytes -= buf.nbytes
            buf = self._scratch[i] = scratch_array(like.size, like.dtype)
            self.scratch_bytes += buf.nbytes
        return buf[:like.size]

    def scratch_of(self, i: int, size: int, dtype: np.dtype) -> np.ndarray:
        """Scratch buffer ``i`` of ``size`` elements of ``dtype`` (which may be more than the
        task's own buffers hold: a tree's subtree blocks), kept across calls."""
        bufs = self._scratch
        while len(bufs) <= i:
            bufs.append(np.empty(0, dtype))
        buf = bufs[i]
        if buf.size < size or buf.dtype != dtype:
            self.scratch_bytes -= buf.nbytes
            buf = bufs[i] = scratch_array(size, dtype)
            self.scratch_bytes += buf.nbytes
        return buf[:size]

    def rebind(self, src: np.ndarray, dst: np.ndarray, key: tuple) -> None:
        """Reuse this finished task for a new call with buffers of the same shape."""
        args = self.args
        args.src = src
        args.dst = dst
        args.channel.rekey(key)
        if self.n_deps or self.state is not COMPLETED:
            self.reset()
            return
        # the reset of a completed task without dependencies, inlined: this is the hot path
        self.state = NOT_READY
        self.result = None
        self.pending = 1
        self._gen = None

    @property
    def runs_again(self) -> bool:
        """Whether an express lane may run this task again as it is (:meth:`express_run`): its
        class keeps this rebind and post, and it has no dependencies."""
        cls = type(self)
        return cls.rebind is StepTask.rebind and cls.post is StepTask.post and not self.n_deps

    def express_run(self, number: int) -> bool:
        """Run this finished task again now, on the buffers it is bound to, as untagged collective
        ``number`` (its engine's express lane, :class:`pycoll.engine.express.ProgramLane`, which
        found the engine idle): :meth:`rebind` to the same buffers and the engine's start, written
        out. True when it finished in its post (the task stays completed); else it is in
        progress, for the engine to poll, or failed."""
        self.args.channel.rekey(("c", number))
        self.result = None
        self.pending = 0
        self.state = IN_PROGRESS
        self._gen = self.run()
        self._wait = ()
        try:
            self._advance()
        except Exception as exc:  # (as the engine's start: the task fails, its request raises)
            self.fail(exc)
        return self.state is COMPLETED

    def run(self) -> Generator[Waitable, None, None]:  # pragma: no cover - abstract
        raise TypeError(f"{type(self).__name__} must define run()")
        yield ()

    def post(self) -> None:
        self._gen = self.run()
        self._wait = ()
        self._advance()

    def progress(self) -> None:
        for req in self._wait:
            if not req.test():
                return
        self._advance()

    def _advance(self) -> None:
        gen = self._gen
        while True:
            try:
                wait = next(gen)
            except StopIteration:
                self._gen = None
                self._wait = ()
                self.complete()
                return
            for req in wait:
                if not req.test():
                    self._wait = wait
                    return

    def on_cancel(self) -> None:
        for req in self._wait:
            req.cancel()
        if self._gen is not None:
            self._gen.close()
            self._gen = None

    def finalize(self) -> None:
        """Release the scratch buffers (the task will not run again)."""
        self._scratch = []
        self.scratch_bytes = 0
        self.unbind()

    def unbind(self) -> None:
        self.args.src = self.args.dst = UNBOUND
        if hasattr(self, "_views"):  # (the views some algorithms keep of the last call's buffers)
            self._views = None

    def describe(self) -> str:
        pending = [r for r in self._wait if not r.done]
        label = f"{self.name} {self.args.channel!r}"
        if not pending:
            return label
        parts = [f"{r.kind} of {r.nbytes} B {'to' if r.kind == 'send' else 'from'} rank {r.peer}"
                 for r in pending]
        return f"{label}: " + ", ".join(parts)

    def reset(self) -> None:
        super().reset()
        self._gen = None
        self._wait = ()


def same_memory(old: np.ndarray, new: np.ndarray) -> bool:
    """Whether the 1-D contiguous view ``new`` sees exactly the memory ``old`` does: it is the same
    array, or both view the whole of one array (a broadcast's ``buf.view(np.uint8)``, made anew for
    every call). An array's memory cannot move while a view of it exists."""
    if old is new:
        return True
    base = new.base
    return (base is not None and base is old.base and type(base) is np.ndarray
            and new.nbytes == old.nbytes == base.nbytes)


class SegmentTask(Task):
    """A collective run by the native state machine of the team's shared segment (``args.shared``).

    It takes its place in the segment's order when it is built (or rebound), i.e. when the caller
    posts it, and waits for its turn before it starts; each engine pass then advances it as far as
    the peers allow. Takes no credit: segment collectives run in posting order on every rank.
    """

    takes_credit = False
    #: Sends no messages: as a unit of the team's credit it holds none (see Team._unit).
    sends_first = False

    def __init__(self, args: CollArgs, kind: int, name: str) -> None:
        super().__init__(name, nbytes=args.nbytes)
        self.args = args
        self.kind = kind
        self.seg = args.shared
        op, dtype = self.codes()  # (first: a builder that rejects its arguments takes no ticket)
        if dtype is None:
            raise TypeError(f"{name}: elements of {args.dst.dtype} have no native type of their size")
        self.ticket = self.seg.ticket()
        self.native = self.seg.new_state(kind, op, dtype, args.root)
        self._bound: Optional[tuple] = None  # (src, dst) the native state points at
        self.started = False
        self.since = 0.0
        #: Whether :meth:`finished` has work (an average to divide; the op never changes).
        self.averages = args.op is ReduceOp.AVG
        self.native.avg = self.averages  # (AVG reduces as SUM; its signature says AVG)

    def codes(self) -> tuple:
        """(op, dtype) codes of the native state machine."""
        raise TypeError(f"{type(self).__name__} must define codes()")

    def post(self) -> None:
        self.started = False
        self.progress()

    def progress(self) -> None:
        """Start on the segment when its turn comes, then advance; a small collective whose peers
        are there completes in the first call. ``since`` is when it first found its peers
        missing (0.0 until then): the segment checks from then on that they are alive."""
        seg = self.seg
        if self.started:
            done = seg.progress(self.native, self.since)
        else:
            if seg.turn != self.ticket:  # an earlier collective on the segment is still running
                if seg.broken is not None:
                    raise seg.broken
                return
            a = self.args
            src, dst = a.src, a.dst
            bound = self._bound
            changed = bound is None or not ((bound[0] is src or same_memory(bound[0], src))
                                            and (bound[1] is dst or same_memory(bound[1], dst)))
            if changed:
                self._bound = (src, dst)
            seg.start(self.native, src, dst, changed)
            self.started = True
            self.since = 0.0
            done = seg.progress(self.native, 0.0)
        if done:
            if self.averages:
                self.finished()
            self.complete()
        elif not self.since:
            self.since = _monotonic()

    def finished(self) -> None:
        """Local work after the segment part: AVG's division (called when :attr:`averages`)."""

    def express_started(self, rc: int) -> None:
        """The engine's express lane (:class:`pycoll.engine.express.ExpressLane`) ran this
        finished collective again in one native call, which returned ``rc`` and not done: it
        waits for its peers now (in progress: :meth:`progress` goes on where the call stopped),
        or it failed (``rc`` < 0: the segment is broken)."""
        seg = self.seg
        self.result = None
        self.pending = 0
        self.state = IN_PROGRESS
        try:
            seg.ran(rc)
        except Exception as exc:
            self.fail(exc)
            return
        self.ticket = seg.turn  # (the native call took it)
        self.started = True
        self.since = _monotonic()

    def sleep(self, timeout_s: float) -> bool:
        """Sleep in the kernel until the flag this collective waits for is set, or ``timeout_s``
        pass (the engine's back-off calls it when this is all it waits on); True if it is set."""
        if not self.started:  # waits for its turn on the segment, not for a flag: just yield
            os.sched_yield()
            return False
        return self.seg.sleep(self.native, timeout_s)

    def on_cancel(self) -> None:
        # the other ranks will run this collective on the segment: its state is lost for all
        self.seg.fail(self.error or CanceledError(f"{self.name} was canceled"))

    def unbind(self) -> None:
        self.args.src = self.args.dst = UNBOUND
        self._bound = None  # (the next start points the native state at its call's buffers)

    def rebind(self, src: np.ndarray, dst: np.ndarray, key: tuple) -> None:
        args = self.args
        args.src = src  # no messages: the key is not needed
        args.dst = dst
        self.ticket = self.seg.ticket()
        if self.n_deps or self.state is not COMPLETED:
            self.reset()
            return
        self.state = NOT_READY  # the reset of a completed task, inlined: this is the hot path
        self.result = None
        self.pending = 1

    def describe(self) -> str:
        s = self.native
        if not self.started:
            return (f"{self.name}: waiting for shm collective #{self.seg.turn} to finish "
                    f"(this is #{self.ticket})")
        return f"{self.name}: {self.seg.waiting_for(s)}"


def copy_in(args: CollArgs) -> None:
    """Out of place: start from the caller's input in the output buffer."""
    if not args.in_place and args.dst.size:
        copy_into(args.dst, args.src)


def finish(args: CollArgs) -> None:
    """AVG: divide once at the end."""
    if args.op is ReduceOp.AVG:
        finish_avg(args.dst, args.size)


def copy_block(dst: np.ndarray, src: np.ndarray) -> None:
    """Copy a rank's own block into place, unless it is already there (in place). The overlap
    test comes first: an array's address (``.ctypes``) costs 2 us, ten copies of a 2 KiB block."""
    if src.size and not (np.may_share_memory(src, dst) and src.ctypes.data == dst.ctypes.data
                         and src.nbytes == dst.nbytes):
        copy_into(dst, src)


def reduce_ordered(out: np.ndarray, parts: Sequence[np.ndarray], op: ReduceOp) -> None:
    """``out = parts[0] op parts[1] op ...`` in this order (so every rank computing it from the
    same parts gets bitwise the same result); ``out`` may be one of the parts."""
    if len(parts) == 1:
        if parts[0] is not out:
            copy_into(out, parts[0])
        return
    acc = np.empty_like(out)
    reduce_into(parts[0], parts[1], op, out=acc)
    for part in parts[2:]:
        reduce_into(acc, part, op)
    copy_into(out, acc)


__all__ = ["Channel", "CollArgs", "StepTask", "as_wire", "block_bounds", "copy_in", "equal_layout",
           "finish", "is_packed", "rebind_args", "reduce_ordered", "Hashable"]
