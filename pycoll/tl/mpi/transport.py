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
    limit_sends,
    split_key,
    too_large,
)

_CHECKED = 1 << 28
_STEP_BITS = 12
_STEP_MASK = (1 << _STEP_BITS) - 1
_SLOT_MASK = 0xFFFF
_HEADER = struct.Struct("<IIQQQ")  # magic, version, key hash, step, payload bytes
_MAGIC = 0x50434F4C  # "PCOL"
_VERSION = 1
_Key = Tuple[int, int, int]  # (source, key hash, step)


def wire_tag(prefix: Hashable, step: int, checked: bool) -> int:
    if not checked:
        return ((prefix[1] & _SLOT_MASK) << _STEP_BITS) | (step & _STEP_MASK)
    return _CHECKED | ((key_hash(prefix) & _SLOT_MASK) << _STEP_BITS) | (step & _STEP_MASK)


def failure(req: TransportRequest, exc: Any, statuses: Any = ()) -> TransportError:
    """The TransportError of ``req`` whose MPI requests failed with ``exc`` (their ``statuses``,
    when tested together, hold each one's error). A message longer than the receive
    (``MPI_ERR_TRUNCATE``) says what that means here: the ranks' calls differ in size."""
    codes = [exc.Get_error_code(), *(st.Get_error() for st in statuses)]
    why = str(exc)
    if any(code and MPI.Get_error_class(code) == MPI.ERR_TRUNCATE for code in codes):
        why = ("a message larger than this rank's receive buffer arrived (MPI_ERR_TRUNCATE): the ranks' "
               "calls differ in size. The agreement check samples calls past a team's first ones "
               "(PYCOLL_CHECK=all checks every call and names the ranks that differ)")
    return TransportError(f"mpi: {req.kind} {'to' if req.kind == 'send' else 'from'} rank {req.peer} "
                          f"(tag {req.tag!r}) failed: {why}")


def _test(req: TransportRequest, mpi_reqs: Any) -> bool:
    """Test MPI requests for ``req``: done when all are; an MPI error becomes a TransportError."""
    try:
        ok = mpi_reqs[0].Test() if len(mpi_reqs) == 1 else MPI.Request.Testall(mpi_reqs)
    except MPI.Exception as exc:
        req.error = failure(req, exc)
        raise req.error from None
    if ok:
        req.done = True
    return ok


class _MPIRequest(TransportRequest):
    __slots__ = ("reqs",)

    def test(self) -> bool:
        if self.done:
            return True
        if self.error is not None:
            raise self.error
        return _test(self, self.reqs)

    def cancel(self) -> None:
        if not self.done:
            for req in self.reqs:
                try:
                    req.Cancel()
                except MPI.Exception:
                    pass


class _MPIRecv(_MPIRequest):
    """A receive posted to MPI (or a send and a receive: ``exchange``); counted when it is done."""

    __slots__ = ("transport",)

    def test(self) -> bool:
        if self.done:
            return True
        if self.error is not None:
            raise self.error
        return self.transport.test_recv(self, self.reqs)


class _CheckedRecv(TransportRequest):
    """A receive of a checked key: waits for its header, then for its payload."""

    __slots__ = ("buf", "transport", "khash", "step", "wire", "payload")

    def test(self) -> bool:
        if self.done:
            return True
        if self.error is not None:
            raise self.error
        if self.payload is None:
            self.transport.probe_channel(self.peer, self.wire)
            if self.payload is None or self.done:
                if self.error is not None:
                    raise self.error
                return self.done
        if _test(self, (self.payload,)):  # its payload (nbytes: as its header announced) arrived
            self.transport.traffic.received(self.peer, self.nbytes)
            return True
        return False

    def cancel(self) -> None:
        if not self.done:
            self.transport.withdraw(self)


class MPIChannel(Channel):
    """A channel whose untagged messages skip key parsing: the tag base is computed once.

    ``stash`` is the transport's store of untagged messages that arrived before their receive: the
    fast receive is taken only while it is empty (a stashed message must match first)."""

    __slots__ = ("fast", "base", "comm", "traffic", "stash")

    def __init__(self, transport: MPITransport, key: tuple, stash: Dict[Tuple[int, int], deque]) -> None:
        super().__init__(transport, key)
        self.comm = transport.comm
        self.traffic = transport.traffic
        self.stash = stash
        self.rekey(key)

    def rekey(self, key: tuple) -> None:
        self.key = key
        self.fast = len(key) == 2 and key[0] == "c"
        self.base = ((key[1] & _SLOT_MASK) << _STEP_BITS) if self.fast else 0

    def isend(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        if not self.fast:
            return self.transport.isend(buf, peer, (*self.key, step))
        req = _MPIRequest("send", peer, step, buf.nbytes)
        req.reqs = (self.comm.Isend([buf, MPI.BYTE], peer, self.base | (step & _STEP_MASK)),)
        self.traffic.sent(peer, buf.nbytes)
        return req

    def irecv(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        if not self.fast or self.stash:
            return self.transport.irecv(buf, peer, (*self.key, step))
        req = _MPIRecv("recv", peer, step, buf.nbytes)
        req.reqs = (self.comm.Irecv([buf, MPI.BYTE], peer, self.base | (step & _STEP_MASK)),)
        req.transport = self.transport
        return req

    def exchange(self, sendbuf: np.ndarray, recvbuf: np.ndarray, peer: int, step: int) -> TransportRequest:
        if not self.fast or self.stash:
            return super().exchange(sendbuf, recvbuf, peer, step)
        tag = self.base | (step & _STEP_MASK)
        req = _MPIRecv("exchange", peer, step, sendbuf.nbytes)
        comm = self.comm
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
        # (source, wire) -> where the next payload on that channel goes (a receive, or None: stash)
        self._payload_for: Dict[Tuple[int, int], Tuple[Optional[_CheckedRecv], _Key, int]] = {}
        self._header_buf = bytearray(_HEADER.size)
        self._statuses = [MPI.Status(), MPI.Status()]  # of receives completing (see test_recv)
        limit_sends(self)

    def channel(self, key: tuple) -> Channel:
        return MPIChannel(self, key, self._stash)

    # ------------------------------------------------------------------ sends
    def isend(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        prefix, step, checked = split_key(tag)
        wire = wire_tag(prefix, step, checked)
        req = _MPIRequest("send", peer, tag, buf.nbytes)
        if checked:
            header = bytearray(_HEADER.pack(_MAGIC, _VERSION, key_hash(prefix), step, buf.nbytes))
            req.reqs = [self.comm.Isend([header, MPI.BYTE], peer, wire),
                        self.comm.Isend([buf, MPI.BYTE], peer, wire)]
        else:
            req.reqs = [self.comm.Isend([buf, MPI.BYTE], peer, wire)]
        self.traffic.sent(peer, buf.nbytes)
        return req

    # ------------------------------------------------------------------ receives
    def irecv(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        prefix, step, checked = split_key(tag)
        wire = wire_tag(prefix, step, checked)
        if not checked:
            req = _MPIRecv("recv", peer, tag, buf.nbytes)
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
        req = _CheckedRecv("recv", peer, tag, buf.nbytes)
        req.buf, req.transport, req.step, req.wire, req.payload = buf, self, step, wire, None
        req.khash = key_hash(prefix)
        k = (peer, req.khash, step)
        stashed = self._kstash.get(k)
        if stashed:
            deliver("mpi", req, buf, stashed.popleft(), self.traffic)
            if not stashed:
                del self._kstash[k]
            self.unexpected_taken(req.khash)
            return req
        target = self._payload_for.get((peer, wire))
        if target is not None and target[0] is None and target[1] == k and target[2] <= buf.nbytes:
            # its header was read before this receive was posted: take the payload directly
            self._payload_for[(peer, wire)] = (req, k, target[2])
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
        they are done, count the bytes that arrived (the receive's status) in :attr:`traffic`
        and, for a plain receive, put them in ``req.nbytes``."""
        statuses = self._statuses
        try:
            if len(mpi_reqs) == 1:
                ok = mpi_reqs[0].Test(statuses[0])
            else:
                ok = MPI.Request.Testall(mpi_reqs, statuses)
        except MPI.Exception as exc:
            req.error = failure(req, exc, statuses[:len(mpi_reqs)])
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

    def withdraw(self, req: _CheckedRecv) -> None:
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
            self.unexpected_arrived(("slot", wire >> _STEP_BITS))
            return
        channel = (src, wire)
        target = self._payload_for.pop(channel, None)
        if target is not None:  # the payload of a header already read
            recv, k, size = target
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
                    deliver("mpi", recv, recv.buf, data, self.traffic)
                else:
                    self._kstash[k].append(data)
            return
        if nbytes != _HEADER.size:
            raise TransportError(f"mpi: expected a {_HEADER.size}-byte header from rank {src} on tag "
                                 f"{wire:#x}, got {nbytes} B")
        msg.Recv([self._header_buf, MPI.BYTE])
        magic, version, khash, step, size = _HEADER.unpack(self._header_buf)
        if magic != _MAGIC or version != _VERSION or (step & _STEP_MASK) != (wire & _STEP_MASK) \
                or ((khash & _SLOT_MASK) << _STEP_BITS) != (wire & (_SLOT_MASK << _STEP_BITS)):
            raise TransportError(f"mpi: malformed header from rank {src} on tag {wire:#x}")
        k = (src, khash, step)
        waiting = self._waiting.get(k)
        recv = None
        if waiting:
            recv = waiting.popleft()
            if not waiting:
                del self._waiting[k]
            if size > recv.buf.nbytes:
                recv.error = too_large("mpi", size, src, recv.tag, recv.buf.nbytes)
                recv = None  # drain it into the stash
        if recv is None:
            self.unexpected_arrived(khash)  # a peer started this collective: its payload has no receive yet
        self._payload_for[channel] = (recv, k, size)

    def progress(self) -> int:
        """Probe the channels where headers or payloads of checked receives are awaited."""
        moved = 0
        if self._waiting or self._payload_for:
            channels = {(r.peer, r.wire) for q in self._waiting.values() for r in q}
            channels.update(self._payload_for)
            for source, wire in channels:
                moved += self.probe_channel(source, wire)
        return moved

    def drain(self) -> int:
        """Receive every message that arrived without a posted receive (into the stash)."""
        return self.probe_channel(MPI.ANY_SOURCE, MPI.ANY_TAG)

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

    def close(self) -> None:
        pass
