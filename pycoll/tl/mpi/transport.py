"""MPI transport over one (duplicated, so private to pycoll) communicator.

Message keys become MPI tags (MPICH allows 29 bits)::

    bit 28      0: untagged collective   1: checked (user tag, partition, point to point)
    bits 12-27  untagged: sequence number mod 2**16; checked: 16 bits of a 64-bit key hash
    bits 0-11   step mod 2**12

Untagged collectives match by posting order, so their sequence numbers are unique among those in
flight and they use plain Irecv (the fast path). Keys with a user tag can collide in 16 bits, so
each such message is preceded by a 32-byte header carrying the full 64-bit key hash and the step;
the receiver probes (``Improbe``) its (source, tag) channel, reads headers, and receives each
payload into the buffer of the receive whose key it names, or stashes it until that receive is
posted. MPI's non-overtaking rule makes the payload the next message after its header.

Marks (see :mod:`pycoll.tl.base`): a marked untagged message of up to :data:`PACK_BYTES` of
payload is one MPI message, the mark then the payload packed into one buffer (a copy each way); a
larger one is two: the mark, then the payload in place on the same tag with :data:`_PART` set (a
contiguous message MPI moves in one copy; a derived datatype of the two went through MPICH's
pipelined copy, which needs the sender's progress: 70-200 ms a MiB while the sender slept). A
checked key's header carries the mark instead (and says whether there is one).

When the engine holds work back for lack of credit it asks :meth:`has_unexpected`; that drains
every message that arrived without a matching receive into the stash, so a peer's sends complete
(the transport contract) and the engine learns which collectives peers have started.

Traffic (``transport.traffic``, payload bytes, not the 32-byte headers of checked keys): a send
counts when it is handed to MPI (``isend``, and the channel's fast ``isend``/``exchange``), a
receive when it completes: receives posted to MPI (the untagged ones) in
:meth:`MPITransport.test_recv`, with the byte count of their status; checked payloads when their
``Irecv`` completes; stashed messages when ``deliver`` copies them in.
"""

from __future__ import annotations

import struct
from collections import defaultdict, deque
from typing import Any, Dict, Hashable, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from pycoll.errors import TransportError
from pycoll.tl.base import (
    Channel,
    Transport,
    TransportRequest,
    deliver,
    key_hash,
    split_key,
    too_large,
)
from pycoll.tl.limit import limit_sends
from pycoll.tl.marks import MARK_BYTES, Mark, unmarked
from pycoll.tl.mpi.requests import (
    HELD,
    CheckedRecv,
    MPIRecv,
    MPIRequest,
    PackedExchange,
    PackedRecv,
    SplitRecv,
    Stage,
    failure,
    let_go,
)

_CHECKED = 1 << 28
#: The payload of a marked untagged message sent in two parts (its mark went on the tag without it).
_PART = 1 << 27
_STEP_BITS = 12
_STEP_MASK = (1 << _STEP_BITS) - 1
_SLOT_MASK = 0x7FFF
_HEADER = struct.Struct("<IIQQQ32s")  # magic, version, key hash, step, payload bytes, mark
_MAGIC = 0x50434F4C  # "PCOL"
_VERSION = 2  # (and _VERSION | _MARKED: a mark follows)
_MARKED = 1 << 16
_NO_MARK = bytes(MARK_BYTES)
_new = object.__new__
#: The most payload bytes a marked untagged message packs with its mark into one buffer (a copy
#: each way); a larger one goes in place, after its mark (see the module doc).
PACK_BYTES = 4096
_Key = Tuple[int, int, int]  # (source, key hash, step)
_Target = Tuple[Any, _Key, int, Optional[bytes]]  # (receive or None, key, size, mark or None)


def wire_tag(prefix: Hashable, step: int, checked: bool) -> int:
    if not checked:
        return ((prefix[1] & _SLOT_MASK) << _STEP_BITS) | (step & _STEP_MASK)
    return _CHECKED | ((key_hash(prefix) & _SLOT_MASK) << _STEP_BITS) | (step & _STEP_MASK)


class MPIChannel(Channel):
    """A channel whose untagged messages skip key parsing: the tag base is computed once.

    ``stash`` is the transport's store of untagged messages that arrived before their receive: the
    fast receive is taken only while it is empty (a stashed message must match first)."""

    __slots__ = ("fast", "base", "comm", "traffic", "stash", "areas", "stages")

    def __init__(self, transport: MPITransport, key: tuple, stash: Dict[Tuple[int, int], deque]) -> None:
        super().__init__(transport, key)
        self.comm = transport.comm
        self.traffic = transport.traffic
        self.stash = stash
        self.areas: Optional[Dict[Tuple[int, int], np.ndarray]] = None  # (marks of large receives)
        #: The stages of packed receives that are free again, by ``step << 24 | peer`` (an int: a
        #: tuple's allocation and hash cost more; see requests.Stage).
        self.stages: Dict[int, Stage] = {}
        self.rekey(key)

    def rekey(self, key: tuple) -> None:
        self.key = key
        self.fast = len(key) == 2 and key[0] == "c"
        self.base = ((key[1] & _SLOT_MASK) << _STEP_BITS) if self.fast else 0

    def isend(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        if not self.fast:
            return super().isend(buf, peer, step)
        mark = self.mark
        req = MPIRequest("send", peer, step, buf.nbytes)
        tag = self.base | (step & _STEP_MASK)
        if mark is None:
            req.reqs = (self.comm.Isend([buf, MPI.BYTE], peer, tag),)
        else:
            req.reqs = self.transport.marked_send(buf, peer, tag, mark)
            req.keep = (buf, mark)
        self.traffic.sent(peer, buf.nbytes)
        return req

    def irecv(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        if not self.fast or self.stash:
            return super().irecv(buf, peer, step)
        mark = self.mark
        if mark is not None:
            return self.marked_recv(buf, peer, self.base | (step & _STEP_MASK), mark, step)
        req = MPIRecv("recv", peer, step, buf.nbytes)
        req.reqs = (self.comm.Irecv([buf, MPI.BYTE], peer, self.base | (step & _STEP_MASK)),)
        req.transport = self.transport
        return req

    def marked_recv(self, buf: np.ndarray, peer: int, tag: int, mark: Mark, step: int) -> TransportRequest:
        """A receive of a marked message into ``buf`` (see the module doc)."""
        n = buf.nbytes
        if n <= PACK_BYTES:
            req: Any = PackedRecv("recv", peer, step, n)
            slot = step << 24 | peer
            stage = self.stages.pop(slot, None)
            if stage is None or stage.n != n:
                stage = Stage(n)
            req.stage = stage
            req.home = self.stages
            req.slot = slot
            req.got = False
            req.reqs = (self.comm.Irecv([stage.buf, MPI.BYTE], peer, tag),)
        else:
            areas = self.areas
            if areas is None:
                areas = self.areas = {}
            area = areas.get((peer, step))
            if area is None:
                area = areas[(peer, step)] = np.empty(MARK_BYTES, np.uint8)
            req = SplitRecv("recv", peer, step, n)
            req.area, req.status = area, MPI.Status()
            comm = self.comm
            req.reqs = (comm.Irecv([area, MPI.BYTE], peer, tag),
                        comm.Irecv([buf, MPI.BYTE], peer, tag | _PART))
        req.transport, req.buf, req.mark = self.transport, buf, mark
        return req

    def exchange(self, sendbuf: np.ndarray, recvbuf: np.ndarray, peer: int, step: int) -> TransportRequest:
        if not self.fast or self.stash:
            return super().exchange(sendbuf, recvbuf, peer, step)
        tag = self.base | (step & _STEP_MASK)
        comm = self.comm
        mark = self.mark
        if mark is not None:
            n = recvbuf.nbytes
            if n > PACK_BYTES or sendbuf.nbytes > PACK_BYTES:
                return super().exchange(sendbuf, recvbuf, peer, step)
            slot = step << 24 | peer
            stages = self.stages
            stage = stages.pop(slot, None)
            if stage is None or stage.n != n:
                stage = Stage(n)
            ex = _new(PackedExchange)  # (TransportRequest.__init__ written out: the hot path)
            ex.kind = "exchange"
            ex.peer = peer
            ex.tag = step
            ex.nbytes = n
            ex.done = ex.got = False
            ex.error = None
            ex.reqs = (comm.Isend([mark.blob + sendbuf.tobytes(), MPI.BYTE], peer, tag),
                       comm.Irecv([stage.buf, MPI.BYTE], peer, tag))
            ex.transport = self.transport
            ex.buf = recvbuf
            ex.mark = mark
            ex.stage = stage
            ex.home = stages
            ex.slot = slot
            self.traffic.sent(peer, sendbuf.nbytes)
            return ex
        req = MPIRecv("exchange", peer, step, sendbuf.nbytes)
        req.reqs = [comm.Isend([sendbuf, MPI.BYTE], peer, tag), comm.Irecv([recvbuf, MPI.BYTE], peer, tag)]
        req.transport = self.transport
        self.traffic.sent(peer, sendbuf.nbytes)
        return req


class MPITransport(Transport):
    """Point-to-point over an mpi4py intracommunicator (ranks are the communicator's ranks)."""

    name = "mpi"

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        tag_ub = comm.Get_attr(MPI.TAG_UB)
        if tag_ub is not None and tag_ub < (1 << 29) - 1:
            raise TransportError(f"mpi: MPI_TAG_UB is {tag_ub}; pycoll needs 29-bit tags")
        # untagged messages that arrived with no receive posted, by (source, wire tag)
        self._stash: Dict[Tuple[int, int], deque] = defaultdict(deque)
        # checked payloads by (source, key hash, step)
        self._kstash: Dict[Tuple[int, int, int], deque] = defaultdict(deque)
        # checked receives waiting for their header, by (source, key hash, step)
        self._waiting: Dict[Tuple[int, int, int], deque] = defaultdict(deque)
        # (source, wire) -> where the next payload on that channel goes (a receive, or None: stash),
        # its key, its size and the mark its header carried (None: none)
        self._payload_for: Dict[Tuple[int, int], _Target] = {}
        self._header_buf = bytearray(_HEADER.size)
        #: Statuses of receives completing (:meth:`test_recv`, ``requests.landed``), under the lock.
        self.statuses = [MPI.Status(), MPI.Status()]
        limit_sends(self)

    def channel(self, key: tuple) -> Channel:
        return MPIChannel(self, key, self._stash)

    # ------------------------------------------------------------------ marks
    def marked_send(self, buf: np.ndarray, peer: int, tag: int, mark: Mark) -> Tuple[Any, ...]:
        """The MPI sends of ``buf`` behind ``mark`` on untagged wire tag ``tag``: one packed message
        up to :data:`PACK_BYTES`, else the mark, then ``buf`` in place (see the module doc)."""
        comm = self.comm
        if buf.nbytes <= PACK_BYTES:
            return (comm.Isend([mark.blob + buf.tobytes(), MPI.BYTE], peer, tag),)
        return (comm.Isend([mark.buf, MPI.BYTE], peer, tag), comm.Isend([buf, MPI.BYTE], peer, tag | _PART))

    def isend_marked(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Mark) -> TransportRequest:
        prefix, step, checked = split_key(tag)
        wire = wire_tag(prefix, step, checked)
        req = MPIRequest("send", peer, tag, buf.nbytes)
        if checked:
            header = bytearray(_HEADER.pack(_MAGIC, _VERSION | _MARKED, key_hash(prefix), step, buf.nbytes,
                                            mark.blob))
            req.reqs = [self.comm.Isend([header, MPI.BYTE], peer, wire),
                        self.comm.Isend([buf, MPI.BYTE], peer, wire)]
        else:
            req.reqs = self.marked_send(buf, peer, wire, mark)
        req.keep = (buf, mark)
        self.traffic.sent(peer, buf.nbytes)
        return req

    def irecv_marked(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Mark) -> TransportRequest:
        prefix, step, checked = split_key(tag)
        if checked:
            return self.irecv(buf, peer, tag, mark)
        wire = wire_tag(prefix, step, checked)
        stashed = self._stash.get((peer, wire))
        if not stashed:
            return MPIChannel(self, prefix, self._stash).marked_recv(buf, peer, wire, mark, step)
        data = stashed.popleft()
        if not stashed:
            del self._stash[(peer, wire)]
        self.unexpected_taken(("slot", wire >> _STEP_BITS))
        if buf.nbytes > PACK_BYTES and data.nbytes == MARK_BYTES:  # (its payload follows: see SplitRecv)
            split = SplitRecv("recv", peer, tag, buf.nbytes)
            split.transport, split.buf, split.mark, split.status = self, buf, mark, MPI.Status()
            split.area = data
            if data.tobytes() != mark.blob:  # (fails at its first test)
                split.reqs, split.done = (None, None), True
                split.error = mark.judge(peer, data.tobytes(), 0, buf.nbytes)
                return split
            parts = self._stash.get((peer, wire | _PART))
            if parts:
                got = parts.popleft()
                if not parts:
                    del self._stash[(peer, wire | _PART)]
                deliver("mpi", split, buf, got, self.traffic)
                return split
            split.reqs = (None, self.comm.Irecv([buf, MPI.BYTE], peer, wire | _PART))
            return split
        req = MPIRequest("recv", peer, tag, buf.nbytes)
        n = data.nbytes - MARK_BYTES
        if unmarked(req, mark, data[:MARK_BYTES].tobytes(), n, buf.nbytes):
            buf[:n] = data[MARK_BYTES:]
            req.nbytes = n
            self.traffic.received(peer, n)
            req.done = True
        return req

    # ------------------------------------------------------------------ sends
    def isend(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        prefix, step, checked = split_key(tag)
        wire = wire_tag(prefix, step, checked)
        req = MPIRequest("send", peer, tag, buf.nbytes)
        if checked:
            header = bytearray(_HEADER.pack(_MAGIC, _VERSION, key_hash(prefix), step, buf.nbytes, _NO_MARK))
            req.reqs = [self.comm.Isend([header, MPI.BYTE], peer, wire),
                        self.comm.Isend([buf, MPI.BYTE], peer, wire)]
        else:
            req.reqs = [self.comm.Isend([buf, MPI.BYTE], peer, wire)]
        self.traffic.sent(peer, buf.nbytes)
        return req

    # ------------------------------------------------------------------ receives
    def irecv(self, buf: np.ndarray, peer: int, tag: Hashable,
              mark: Optional[Mark] = None) -> TransportRequest:
        """A receive (``mark``: of a checked key, the mark its header must carry; see
        :meth:`irecv_marked`)."""
        prefix, step, checked = split_key(tag)
        wire = wire_tag(prefix, step, checked)
        if not checked:
            req = MPIRecv("recv", peer, tag, buf.nbytes)
            req.transport = self
            stashed = self._stash.get((peer, wire))
            if stashed:
                deliver("mpi", req, buf, stashed.popleft(), self.traffic)
                if not stashed:
                    del self._stash[(peer, wire)]
                self.unexpected_taken(("slot", wire >> _STEP_BITS))
                return req
            req.reqs = [self.comm.Irecv([buf, MPI.BYTE], peer, wire)]
            return req
        req = CheckedRecv("recv", peer, tag, buf.nbytes)
        req.buf, req.transport, req.step, req.wire, req.payload, req.mark = buf, self, step, wire, None, mark
        req.khash = key_hash(prefix)
        k = (peer, req.khash, step)
        stashed = self._kstash.get(k)
        if stashed:
            theirs, data = stashed.popleft()
            if not stashed:
                del self._kstash[k]
            self.unexpected_taken(req.khash)
            if mark is None or unmarked(req, mark, theirs or b"", data.nbytes, buf.nbytes):
                deliver("mpi", req, buf, data, self.traffic)
            return req
        target = self._payload_for.get((peer, wire))
        if target is not None and target[0] is None and target[1] == k and target[2] <= buf.nbytes and (
                mark is None or (target[3] == mark.blob and target[2] == buf.nbytes)):
            # its header was read before this receive was posted: take the payload directly
            self._payload_for[(peer, wire)] = (req, k, target[2], target[3])
            self.unexpected_taken(req.khash)
            self.probe_channel(peer, wire)
            return req
        self._waiting[k].append(req)
        self.probe_channel(peer, wire)
        return req

    def probe(self, peer: int, tag: Hashable) -> bool:
        prefix, step, checked = split_key(tag)
        wire = wire_tag(prefix, step, checked)
        self.probe_channel(peer, wire)
        if not checked:
            return bool(self._stash.get((peer, wire)))
        k = (peer, key_hash(prefix), step)
        if self._kstash.get(k):
            return True
        target = self._payload_for.get((peer, wire))  # its header was read, the payload follows
        return target is not None and target[0] is None and target[1] == k

    def test_recv(self, req: TransportRequest, mpi_reqs: Any) -> bool:
        """Test ``req``'s MPI requests, the last of them a receive (its receives' ``test``): once
        they are done, count the bytes that arrived (the receive's status) in :attr:`traffic` and,
        for a receive, put them in ``req.nbytes``."""
        statuses = self.statuses
        try:
            if len(mpi_reqs) == 1:
                ok = mpi_reqs[0].Test(statuses[0])
            else:
                ok = MPI.Request.Testall(mpi_reqs, statuses)
        except MPI.Exception as exc:
            req.error = failure(req, exc, statuses[:len(mpi_reqs)], self)
            raise req.error from None
        if ok:
            status = statuses[len(mpi_reqs) - 1]
            if not status.Is_cancelled():
                n = status.Get_count(MPI.BYTE)
                if req.kind == "recv":
                    req.nbytes = n
                self.traffic.received(req.peer, n)
            req.done = True
        return ok

    def withdraw(self, req: CheckedRecv) -> None:
        """Stop waiting for a checked receive's header (its ``cancel``)."""
        q = self._waiting.get((req.peer, req.khash, req.step))
        if q and req in q:
            q.remove(req)

    # ------------------------------------------------------------------ probing
    def probe_channel(self, source: int, wire: int) -> int:
        """Handle every message that arrived on (source, wire) without a posted receive; returns
        how many (checked receives call it while they wait for their header)."""
        handled = 0
        while True:
            msg, status = self._improbe(source, wire)
            if msg is None:
                return handled
            self._route(msg, status)
            handled += 1

    def _improbe(self, source: int, tag: int) -> Tuple[Any, Any]:
        status = MPI.Status()
        msg = self.comm.Improbe(source, tag, status)
        return msg, status

    def _route(self, msg: Any, status: Any) -> None:
        """Receive one probed message: an untagged payload (stash it), a checked header, or the
        payload that follows a header (into its receive's buffer, or the stash)."""
        src, wire, nbytes = status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)
        if not wire & _CHECKED:
            data = np.empty(nbytes, np.uint8)
            msg.Recv([data, MPI.BYTE])
            self._stash[(src, wire)].append(data)
            if not wire & _PART:  # (a payload part comes with its mark, which counts for both)
                self.unexpected_arrived(("slot", wire >> _STEP_BITS))
            return
        channel = (src, wire)
        target = self._payload_for.pop(channel, None)
        if target is not None:  # the payload of a header already read
            recv, k, size, theirs = target
            if nbytes != size:
                raise TransportError(f"mpi: rank {src} announced {size} B but sent {nbytes} B")
            if recv is not None:
                recv.nbytes = nbytes
                recv.payload = msg.Irecv([recv.buf, MPI.BYTE])
            else:
                data = np.empty(nbytes, np.uint8)
                msg.Recv([data, MPI.BYTE])
                waiting = self._waiting.get(k)
                if waiting:  # posted since its header was read
                    recv = waiting.popleft()
                    if not waiting:
                        del self._waiting[k]
                    self.unexpected_taken(k[1])
                    if recv.mark is None or unmarked(recv, recv.mark, theirs or b"", nbytes, recv.buf.nbytes):
                        deliver("mpi", recv, recv.buf, data, self.traffic)
                else:
                    self._kstash[k].append((theirs, data))
            return
        if nbytes != _HEADER.size:
            raise TransportError(f"mpi: expected a {_HEADER.size}-byte header from rank {src} on tag "
                                 f"{wire:#x}, got {nbytes} B")
        msg.Recv([self._header_buf, MPI.BYTE])
        magic, version, khash, step, size, mark = _HEADER.unpack(self._header_buf)
        if magic != _MAGIC or version & ~_MARKED != _VERSION or (step & _STEP_MASK) != (wire & _STEP_MASK) \
                or ((khash & _SLOT_MASK) << _STEP_BITS) != (wire & (_SLOT_MASK << _STEP_BITS)):
            raise TransportError(f"mpi: malformed header from rank {src} on tag {wire:#x}")
        theirs = mark if version & _MARKED else None
        k = (src, khash, step)
        waiting = self._waiting.get(k)
        recv = None
        if waiting:
            recv = waiting.popleft()
            if not waiting:
                del self._waiting[k]
            if recv.mark is not None and not unmarked(recv, recv.mark, theirs or b"", size, recv.buf.nbytes):
                recv = None  # (failed: drain its payload into the stash)
            elif size > recv.buf.nbytes:
                recv.error = too_large("mpi", size, src, recv.tag, recv.buf.nbytes)
                recv = None  # drain it into the stash
        if recv is None:
            self.unexpected_arrived(khash)  # a peer started this collective: its payload has no receive yet
        self._payload_for[channel] = (recv, k, size, theirs)

    def progress(self) -> int:
        """Probe the channels where headers or payloads of checked receives are awaited."""
        moved = let_go() if HELD else 0
        if self._waiting or self._payload_for:
            channels = {(r.peer, r.wire) for q in self._waiting.values() for r in q}
            channels.update(self._payload_for)
            for source, wire in channels:
                moved += self.probe_channel(source, wire)
        return moved

    def drain(self) -> int:
        """Receive every message that arrived without a posted receive (into the stash)."""
        return self.probe_channel(MPI.ANY_SOURCE, MPI.ANY_TAG)

    def stray(self, key: tuple, mark: Mark) -> Optional[Tuple[int, bytes, int]]:
        self.drain()  # (every message that waits is in the stashes now)
        prefix, _, checked = split_key((*key, 0))
        if not checked:
            slot = prefix[1] & _SLOT_MASK
            for (src, wire), q in self._stash.items():
                if not wire & _CHECKED and wire >> _STEP_BITS == slot:
                    for data in q:
                        if data[:MARK_BYTES].tobytes() != mark.blob:
                            return src, data[:MARK_BYTES].tobytes(), data.nbytes - MARK_BYTES
            return None
        khash = key_hash(prefix)
        for (src, h, _), q in self._kstash.items():
            for theirs, data in q:
                if h == khash and theirs != mark.blob:
                    return src, theirs or b"", data.nbytes
        for recv, (src, h, _), size, theirs in self._payload_for.values():
            if recv is None and h == khash and theirs != mark.blob:
                return src, theirs or b"", size
        return None

    def demand_id(self, key: tuple) -> Hashable:
        prefix, _, checked = split_key((*key, 0))
        if not checked:  # untagged messages carry only the sequence number's slot
            return ("slot", prefix[1] & _SLOT_MASK)
        return key_hash(prefix)

    def poll_unexpected(self) -> None:
        self.drain()

    def pending(self) -> List[str]:
        """What is stashed or awaited (for diagnostics)."""
        return [f"stash {k}: {len(q)}" for k, q in self._stash.items()] + \
            [f"kstash {k}: {len(q)}" for k, q in self._kstash.items()] + \
            [f"waiting {k}: {len(q)}" for k, q in self._waiting.items()]
