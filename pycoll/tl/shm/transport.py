"""Point-to-point over shared memory: single-copy transfers with ``process_vm_readv`` (CMA).

For every (sender, receiver) pair the segment holds a ring of descriptors. ``isend`` publishes
(key hash, step, size, address of the sender's buffer) in the next free descriptor; the receiver's
progress reads descriptors in ring order and copies each payload straight out of the sender's
memory, into the posted receive's buffer when there is one (one copy in all), else into a buffer
of its own that the receive takes later; then it marks the descriptor consumed and the send
completes. So a send completes whatever its receiver has posted, as the transport contract asks.

Nothing in a descriptor is trusted: sizes are checked against the receive buffer and a limit, the
process read is the one that attached as that rank (never an address's claimed owner), and a bad
address is a ``TransportError``, not a crash. Teams whose kernel forbids CMA between their ranks
keep their network transport for point-to-point (the segment collectives copy through the segment
and work anyway).

Lowered programs run natively on this path (:mod:`pycoll.tl.shm.executor`, ``native/exec_shm.c``):
the executor posts and reads descriptors on the same rings, through the cursors this transport
keeps in C arrays. Each side takes the heads of a ring that are its own: the executor those of
the collectives it runs (their key hashes are registered while they run), this transport every
other (see :meth:`ShmTransport._read`); a message of a program that arrived before the program
started is handed to it when it starts.

Marks (:mod:`pycoll.tl.marks`): a marked message's descriptor carries its mark (flagged marked;
the payload is where it is for any message), so the wire is the same for the executor and for
:meth:`ShmTransport.isend_marked` and :meth:`ShmTransport.irecv_marked`. A marked receive compares
the descriptor's mark and size with its own before it reads the payload (``unmarked``): one that
fails reads none of it (the descriptor is consumed all the same, so that the send completes). A
message that came before its receive (stashed, or handed to a native program) keeps its mark for
that comparison, made when the receive is posted. An unmarked receive takes a marked message's
payload as any other.

Traffic (``transport.traffic``): a send counts in :meth:`ShmTransport.isend` (even while it waits
for a free descriptor), a receive when its payload has been copied: in :meth:`ShmTransport._read`,
or in ``irecv`` for a message copied before it was posted. The segment collectives (allreduce_shm
and the others) and the cma allgather's reads move data without this transport: not counted.
"""

from __future__ import annotations

import mmap
import os
import statistics
import time
from collections import defaultdict, deque
from errno import ESRCH
from typing import Any, Callable, Dict, Hashable, List, Optional, Set, Tuple

import numpy as np

from pycoll.errors import PeerLostError, TransportError
from pycoll.native import address, ffi, lib
from pycoll.tl.base import Transport, TransportRequest, deliver, key_hash, split_key, too_large
from pycoll.tl.limit import limit_sends
from pycoll.tl.marks import MARK_BYTES, Mark, unmarked
from pycoll.tl.shm.segment import LIVENESS_S, ShmSegment, cause_order

RING = 64  # PC_RING
POSTED, CONSUMED = 1, 2
MARKED = 1  # (PC_DESC_MARKED: a descriptor's flags)
ECMA = -6  # (PC_ECMA: reading a peer's memory failed; errno says why)
#: How long reads of a peer's memory may fail before a peer that still looks alive is lost (see
#: ShmTransport.unreadable).
LEAVING_S = 0.5
MAX_MESSAGE = 1 << 40


class _Send(TransportRequest):
    __slots__ = ("buf", "khash", "step", "slot", "seq", "mark")


class _Recv(TransportRequest):
    __slots__ = ("buf", "mark")


#: A read by process_vm_readv that costs more than this many in-cache copies of the same bytes
#: makes the team's single copy "slow" (:attr:`ShmSegment.cma_slow`): on a 2-core x86 VM where
#: :func:`cma_cost` gives 2.4-3.4, the segment's two copies beat the single copy for scatter and
#: gather up to 2 MiB and alltoall below 256 KiB (docs/selection.md); on the VM the cma rules were
#: first measured on the single copy won from 64 KiB.
CMA_SLOW_RATIO = 2.0
#: The bytes :func:`cma_cost` reads and copies (the middle of the range the cma rules decide).
CMA_PROBE_BYTES = 256 << 10


def cma_cost(pid: int, nbytes: int = CMA_PROBE_BYTES, reps: int = 16) -> float:
    """What reading ``nbytes`` of process ``pid``'s memory (this process's own: the same kernel
    path) with process_vm_readv costs, in copies of the same bytes in cache (best of ``reps``
    each, after one of each untimed); inf when the read fails."""
    # fresh mappings of their own: where malloc would place them (heap or mmap, reused or new)
    # changes what a copy costs by up to 10x on some VMs
    src_map, dst_map = mmap.mmap(-1, nbytes), mmap.mmap(-1, nbytes)
    src, dst = np.frombuffer(src_map, np.uint8), np.frombuffer(dst_map, np.uint8)
    src.fill(1)
    dst.fill(1)
    to, at = ffi.from_buffer(dst), address(src)
    best_read = best_copy = float("inf")
    lib.pycoll_cma_read(pid, to, at, nbytes)
    np.copyto(dst, src)
    for _ in range(reps):
        t0 = time.perf_counter()
        n = lib.pycoll_cma_read(pid, to, at, nbytes)
        t1 = time.perf_counter()
        np.copyto(dst, src)
        t2 = time.perf_counter()
        if n != nbytes:
            best_read = float("inf")
            break
        best_read, best_copy = min(best_read, t1 - t0), min(best_copy, t2 - t1)
    del to, src, dst
    src_map.close()
    dst_map.close()
    return float("inf") if best_read == float("inf") else best_read / max(best_copy, 1e-9)


#: This process's :func:`cma_cost`, by pid: measured at its first team on a segment (2-3 ms of a
#: 3 ms bootstrap on a 2-core VM), taken again by the next teams (what a read costs here does not
#: change from one team to the next; a forked child measures its own).
_MEASURED: Dict[int, float] = {}


def own_cma_cost() -> float:
    """:func:`cma_cost` of this process, measured once (see :data:`_MEASURED`)."""
    pid = os.getpid()
    cost = _MEASURED.get(pid)
    if cost is None:
        cost = _MEASURED[pid] = cma_cost(pid)
    return cost


def cma_works(seg: ShmSegment, allgather: Callable[[bytes], List[bytes]]) -> bool:
    """Whether every rank may read rank 0's memory with process_vm_readv (collective); sets
    ``seg.cma_slow`` from every rank's :func:`cma_cost` (the median, so every rank decides alike)."""
    probe = np.array([0x5043434D41], np.uint64)  # "PCCMA"
    infos = allgather(f"{address(probe)}".encode())
    ok = True
    if seg.rank != 0:
        got = np.zeros(1, np.uint64)
        n = lib.pycoll_cma_read(seg.pids[0], ffi.from_buffer(got), int(infos[0]), 8)
        ok = n == 8 and got[0] == probe[0]
    cost = own_cma_cost() if ok else float("inf")
    votes = [v.decode().split("|") for v in allgather(f"{int(ok)}|{cost!r}".encode())]
    del probe  # kept alive until every rank has read it (the allgather above)
    # (statistics, not numpy: np.median imports numpy.ma, 50 ms of a process's first team)
    seg.cma_slow = statistics.median(float(c) for _, c in votes) > CMA_SLOW_RATIO
    return all(w == "1" for w, _ in votes)


class ShmTransport(Transport):
    """Messages between the ranks of a team on one host, through its segment."""

    name = "shm"
    #: Its native programs carry marks (``native/exec_shm.c``), on the same wire as this class.
    program_marks = True

    def __init__(self, seg: ShmSegment) -> None:
        self.ffi, self.lib, self.seg = ffi, lib, seg
        self.rank, self.size = seg.rank, seg.size
        self._base, self._mapped = seg.base, seg.total
        # the rings' cursors, shared with the program executor (native/exec_shm.c)
        self._send_slot = ffi.new("uint32_t[]", self.size)
        self._outstanding: List[deque] = [deque() for _ in range(self.size)]  # posted, not consumed
        self._queued: List[deque] = [deque() for _ in range(self.size)]  # waiting for a free slot
        self._recv_slot = ffi.new("uint32_t[]", self.size)
        # nonzero: the executor's programs fail on that peer (1: it is lost; 2: another is)
        self._errflags = ffi.new("int32_t[]", self.size)
        self._first_lost: Optional[TransportError] = None
        self._pids = ffi.new("int64_t[]", list(seg.pids))
        self._native: Dict[int, Any] = {}  # key hash -> the native program task running that collective
        self._held: List[Tuple[Any, Callable[[], bool]]] = []  # given-up programs peers may still read
        self._posted: Dict[Tuple[int, int, int], deque] = defaultdict(deque)
        # (src, key hash, step) -> (mark or None, payload) of messages that came before their receive
        self._stash: Dict[Tuple[int, int, int], deque] = defaultdict(deque)
        self._desc = ffi.new("uint64_t[6]")
        self._theirs = ffi.new("uint8_t[]", MARK_BYTES)  # (the mark of the descriptor taken)
        self._seq = 0
        self._busy_since = 0.0
        self._dead: Dict[int, TransportError] = {}
        self._vanished: Set[int] = set()  # peers whose memory could not be read: no such process
        self._suspect: Dict[int, float] = {}  # peer -> when its memory first could not be read
        self._programs: Dict[int, Any] = {}  # id(program) -> (program, its NativeProgram)
        self.limited = limit_sends(self) is not None

    # ------------------------------------------------------------------ sends
    def isend(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        return self._send(buf, peer, tag, None)

    def isend_marked(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Mark) -> TransportRequest:
        """Send ``buf`` with ``mark`` in its descriptor (the bytes it holds now, should the send
        wait for a free descriptor)."""
        return self._send(buf, peer, tag, mark)

    def _send(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Optional[Mark]) -> TransportRequest:
        """:meth:`isend` (``mark`` None) and :meth:`isend_marked`: each is wrapped on its own by a
        bandwidth limit, so neither calls the other."""
        self._check_peer(peer)
        prefix, step, _ = split_key(tag)
        req = _Send("send", peer, tag, buf.nbytes)
        req.buf, req.khash, req.step = buf, key_hash(prefix), step
        req.mark = ffi.NULL if mark is None else mark.blob
        self._seq += 1
        req.seq = self._seq
        self.traffic.sent(peer, buf.nbytes)
        if self._queued[peer] or not self._post(req):
            self._queued[peer].append(req)
        return req

    def _post(self, req: _Send) -> bool:
        peer = req.peer
        slot = self._send_slot[peer]
        rc = self.lib.pycoll_p2p_post(self._base, self._mapped, self.size, self.rank, peer, slot, req.khash,
                                      req.step, req.buf.nbytes, address(req.buf), req.seq, req.mark)
        if rc < 0:
            raise TransportError(f"shm: cannot post a message to rank {peer}: segment error {rc}")
        if rc == 0:
            return False  # the ring to this peer is full
        req.slot = slot
        self._send_slot[peer] = (slot + 1) % RING
        self._outstanding[peer].append(req)
        return True

    # ------------------------------------------------------------------ receives
    def irecv(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        return self.irecv_marked(buf, peer, tag, None)

    def irecv_marked(self, buf: np.ndarray, peer: int, tag: Hashable,
                     mark: Optional[Mark]) -> TransportRequest:
        """Receive into ``buf`` a message whose descriptor must carry ``mark`` and be ``buf``'s
        size (None: any message that fits, marked or not)."""
        self._check_peer(peer)
        prefix, step, _ = split_key(tag)
        k = (peer, key_hash(prefix), step)
        req = _Recv("recv", peer, tag, buf.nbytes)
        req.buf, req.mark = buf, mark
        stashed = self._stash.get(k)
        if stashed:
            theirs, data = stashed.popleft()
            if not stashed:
                del self._stash[k]
            self.unexpected_taken(k[1])
            if mark is None or unmarked(req, mark, theirs or b"", data.nbytes, buf.nbytes):
                deliver("shm", req, req.buf, data, self.traffic)
            return req
        self._posted[k].append(req)
        self._read(peer)
        return req

    def probe(self, peer: int, tag: Hashable) -> bool:
        self._check_peer(peer)
        self._read(peer)
        prefix, step, _ = split_key(tag)
        return bool(self._stash.get((peer, key_hash(prefix), step)))

    def _read(self, src: int) -> int:
        """Copy every message rank ``src`` has posted to us; return how many."""
        lib, out, moved = self.lib, self._desc, 0
        while True:
            slot = self._recv_slot[src]
            rc = lib.pycoll_p2p_take(self._base, self._mapped, self.size, src, self.rank, slot, out,
                                     self._theirs)
            if rc <= 0:
                if rc < 0:
                    self._lose(src, TransportError(f"shm: bad descriptor from rank {src} (error {rc})"))
                return moved
            khash = int(out[0])
            if khash in self._native:
                return moved  # (a message of a program running natively: the executor takes it)
            step, nbytes, addr = int(out[1]), int(out[2]), int(out[3])
            k = (src, khash, step)
            queue = self._posted.get(k)
            recv = queue.popleft() if queue else None
            if queue is not None and not queue:
                del self._posted[k]
            if nbytes > MAX_MESSAGE:
                self._lose(src, TransportError(f"shm: rank {src} announced a message of {nbytes} B"))
                return moved
            theirs = self.ffi.buffer(self._theirs)[:] if out[5] & MARKED else None
            if recv is not None and recv.mark is not None and not unmarked(
                    recv, recv.mark, theirs or b"", nbytes, recv.buf.nbytes):
                # (refused: none of its payload is read; consumed, so that its sender's send completes)
                lib.pycoll_p2p_consumed(self._base, self._mapped, self.size, src, self.rank, slot)
                self._recv_slot[src] = (slot + 1) % RING
                moved += 1
                continue
            if recv is not None and nbytes > recv.buf.nbytes:
                recv.error = too_large("shm", nbytes, src, recv.tag, recv.buf.nbytes)
                recv.done = True
                recv = None
            target = recv.buf if recv is not None else np.empty(nbytes, np.uint8)
            if nbytes:
                local = self.ffi.from_buffer(target)
                got = lib.pycoll_p2p_read(self._base, self._mapped, self.size, src, self.rank, slot,
                                          self.seg.pids[src], local, addr, nbytes)
                if got != nbytes:
                    err = self.unreadable(src, nbytes, self.ffi.errno if got == ECMA else 0, got)
                    if err is None:  # (try again later: the receive waits at the front of its queue)
                        if recv is not None:
                            self._posted[k].appendleft(recv)
                        return moved
                    if recv is not None:  # (taken off the posted ones already: fail it too)
                        recv.error = err
                    self._lose(src, err)
                    return moved
                if self._suspect:
                    self._suspect.pop(src, None)
            lib.pycoll_p2p_consumed(self._base, self._mapped, self.size, src, self.rank, slot)
            self._recv_slot[src] = (slot + 1) % RING
            if recv is not None:
                recv.nbytes = nbytes
                recv.done = True
                self.traffic.received(src, nbytes)
            else:
                self._stash[k].append((theirs, target))
                self.unexpected_arrived(khash)
            moved += 1

    # ------------------------------------------------------------------ engine side
    def progress(self) -> int:
        moved = 0
        lib = self.lib
        busy = False
        for peer in range(self.size):
            outstanding = self._outstanding[peer]
            while outstanding:  # the receiver consumes in ring order
                req = outstanding[0]
                state = lib.pycoll_p2p_state(self._base, self._mapped, self.size, self.rank, peer, req.slot)
                if state != CONSUMED:
                    if state < 0:
                        self._lose(peer, TransportError(f"shm: segment error {state}"))
                    break
                lib.pycoll_p2p_free(self._base, self._mapped, self.size, self.rank, peer, req.slot)
                outstanding.popleft()
                req.done = True
                req.buf = None
                moved += 1
            queued = self._queued[peer]
            while queued and self._post(queued[0]):
                queued.popleft()
            moved += self._read(peer)
            busy = busy or bool(outstanding or queued)
        if self._held:
            self._held = [h for h in self._held if not h[1]()]
        if busy or self._posted or self._native:
            now = time.monotonic()
            if not self._busy_since:
                self._busy_since = now
            elif now - self._busy_since > LIVENESS_S:
                self._busy_since = now
                self._check_liveness()
        else:
            self._busy_since = 0.0
        return moved

    def unreadable(self, src: int, nbytes: int, errno: int, code: int = ECMA) -> Optional[TransportError]:
        """A read of ``nbytes`` from rank ``src``'s memory failed (``errno`` of process_vm_readv,
        else the segment's error ``code``): the error to fail with, or None to try again later. A
        live peer keeps what it posted until it is read, so memory that cannot be read is a peer on
        its way out (a failed rank exiting frees its buffers) that /proc shows a moment later: a
        PeerLostError naming every peer that left once it does, a TransportError (``src`` lost) if
        it still looks alive ``LEAVING_S`` after the first failure. Never waits."""
        if errno == ESRCH:  # (its memory is gone: it is exiting, before /proc says so)
            self._vanished.add(src)
        if src not in self._dead and (src in self._vanished or self.seg.left_for_good(src) is not None):
            self._check_liveness()  # (lose it, and every other peer that left, naming them all)
        if src in self._dead:
            self._suspect.pop(src, None)
            return self._dead[src]
        now = time.monotonic()
        since = self._suspect.setdefault(src, now)
        if now - since < LEAVING_S:
            return None
        del self._suspect[src]
        why = os.strerror(errno) if errno else f"segment error {code}"
        err = TransportError(f"shm: cannot read {nbytes} B from rank {src}'s memory ({why})")
        self._lose(src, err)
        return err

    def _check_liveness(self) -> None:
        """Lose every peer that left for good: its process is gone or a zombie, or it said it left
        (exited, raised, closed the team; not a rank whose collective failed while it lives: see
        :meth:`ShmSegment.left_for_good`). Each one's error names them all, the first cause first
        (:func:`cause_order`: a rank that exited may have done so after failing on one that died)."""
        lost = []
        for r, pid in enumerate(self.seg.pids):
            if r != self.rank:
                gone = (0, "has died") if r in self._vanished else self.seg.left_for_good(r)
                if gone is not None:
                    lost.append((cause_order(gone[0]), r, pid, gone[1]))
        if all(r in self._dead for _, r, _, _ in lost):
            return
        lost.sort()
        text = "; ".join(f"rank {r} (pid {pid}) {how}" for _, r, pid, how in lost)
        _, first, pid, how = lost[0]
        for order, r, _, _ in lost:
            if r not in self._dead:
                self._lose(r, PeerLostError(f"shm: {text}", rank=first, pid=pid, how=how), order == 0)

    def _lose(self, peer: int, err: TransportError, crashed: bool = False) -> None:
        """Fail every operation with ``peer``; later ones fail at once. ``crashed``: the peer died
        or raised (it did not exit after its part): the native programs (collectives, which need
        every rank of the team) fail too, whichever peer they wait on, or a live peer that failed on
        the lost one would keep them waiting until the timeout. (Not for a peer that exited or
        closed the team: it may have done its part of a collective another rank still finishes.)"""
        self._dead[peer] = err
        if crashed:
            if self._first_lost is None:
                self._first_lost = err
            for r in range(self.size):
                if not self._errflags[r]:
                    self._errflags[r] = 2  # (that peer lives: the executor names first_lost)
        self._errflags[peer] = 1
        for req in list(self._outstanding[peer]) + list(self._queued[peer]):
            req.error = err
        self._outstanding[peer].clear()
        self._queued[peer].clear()
        for k in [k for k in self._posted if k[0] == peer]:
            for req in self._posted.pop(k):
                req.error = err

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"shm: peer {peer} is not a rank of a team of {self.size}")
        if peer in self._dead:
            raise self._dead[peer]

    def poll_unexpected(self) -> None:
        self.progress()

    # ------------------------------------------------------------------ native programs
    def native(self) -> Tuple[Any, Any]:
        """pycoll._native's cffi ``(ffi, lib)`` (the program executor is in it)."""
        return self.ffi, self.lib

    def bind_executor(self, e: Any) -> None:
        """Point the executor state ``e`` (``pc_sx_t``) at this transport's segment, rings' cursors
        and lost peers."""
        e.base, e.mapped = self.ffi.cast("void *", self._base), self._mapped
        e.pids, e.errflags = self._pids, self._errflags
        e.send_slot, e.recv_slot = self._send_slot, self._recv_slot

    def native_started(self, task: Any, keys: Tuple[int, int]) -> None:
        """Native program ``task`` started on collective key hashes ``keys`` (the collective's and
        its agreement exchange's): until :meth:`native_ended`, :meth:`_read` leaves their messages
        to its executor. Messages of them this transport already took are handed to it
        (``task.early(src, key hash, step, payload, mark)``, mark None where there was none)."""
        for khash in keys:
            self._native[khash] = task
        if self._stash:
            for k in [k for k in self._stash if k[1] in keys]:
                src, khash, step = k
                for theirs, data in self._stash.pop(k):
                    self.unexpected_taken(khash)
                    task.early(src, khash, step, data, theirs)

    def native_ended(self, keys: Tuple[int, int]) -> None:
        """The native program running on key hashes ``keys`` ended, failed or was cancelled."""
        for khash in keys:
            self._native.pop(khash, None)

    def stray(self, key: tuple, mark: Mark) -> Optional[Tuple[int, bytes, int]]:
        self.progress()
        khash = key_hash(split_key((*key, 0))[0])
        for (src, h, _), q in self._stash.items():
            for theirs, data in q:
                if h == khash and theirs != mark.blob:
                    return src, theirs or b"", data.nbytes
        return None

    def has_stash(self) -> bool:
        """Whether messages that arrived before their receives wait here."""
        return bool(self._stash)

    def keep_until_done(self, owner: Any, done: Callable[[], bool]) -> None:
        """Keep ``owner`` (and so the buffers its posted descriptors name) until ``done()``, asked as
        the transport progresses."""
        self._held.append((owner, done))

    def lost(self, peer: int) -> Optional[TransportError]:
        """The error that lost ``peer`` (None while it is not lost)."""
        return self._dead.get(peer)

    @property
    def first_lost(self) -> Optional[TransportError]:
        """The error of the first peer this transport lost that died or raised (None: none did)."""
        return self._first_lost

    def program_task(self, args: Any, program: Any, credit_bytes: int, check: Optional[tuple] = None) -> Any:
        """A task running ``program`` natively for ``args`` (see :mod:`pycoll.tl.shm.executor`), or
        None where it must run in Python: under a credit limit (``credit_bytes``), a bandwidth
        limit, or for a tagged key. ``check``: the agreement check the program runs first
        (:class:`pycoll.tl.program_task.Check`)."""
        if credit_bytes or self.limited or args.channel.key[0] not in ("c", "unkeyed"):
            return None
        from pycoll.tl.shm.executor import ShmProgramTask, prepared  # noqa: PLC0415

        return ShmProgramTask(args, prepared(self, self._programs, program, check))

