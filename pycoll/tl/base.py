"""The transport interface every transport layer implements.

A transport moves contiguous byte buffers between the ranks of one team: non-blocking tagged
``isend``/``irecv`` to a peer (a rank of the team), requests that are tested and may be canceled,
and a ``progress()`` the engine calls on every pass.

Contract (the engine's deadlock-freedom rests on it): a send completes without the receiver having
posted the matching receive (the transport buffers unexpected messages), so credit held by sends
is always given back. Messages between one pair of ranks with the same tag match in order.

Marks (the agreement check that travels with the data): see :mod:`pycoll.tl.marks`.

Bandwidth limit (``PYCOLL_BW_LIMIT``, for experiments): every transport calls
:func:`pycoll.tl.limit.limit_sends` once at the end of its constructor (see :mod:`pycoll.tl.limit`).

Traffic accounting: every transport counts what it moves in its :attr:`Transport.traffic` (a
:class:`Traffic`), per peer as the transport numbers them (team ranks for a team's transport):
bytes and messages sent, counted when the transport takes the send (for a send the bandwidth
limiter held back: when it releases it), and bytes and messages received, counted when the receive
completes, with the bytes that arrived. Only payload is counted, never the transports' own headers
(tcp: 32 B per message; mpi: 32 B, ucx: 24 B per message of a tagged/checked key; shm: a descriptor
in the segment). A rank's messages to itself count under its own rank (they never cross a NIC:
``total(include_self=False)`` leaves them out). Data moved through a host's shared segment by the
shm collectives, and the peer-memory reads of the cma allgather, bypass the transports and are not
counted (the cma allgather's small address and acknowledgement messages are). Each transport counts
in its own send and receive paths (its module doc says where); a transport written elsewhere counts
only what it reports with ``self.traffic.sent(peer, nbytes)`` and ``self.traffic.received(peer, nbytes)``.
"""

from __future__ import annotations

import abc
import hashlib
import re
import time
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Set, Tuple

import numpy as np

from pycoll.errors import PeerLostError, TransportError
from pycoll.tl.marks import MARK_BYTES, Mark, unmarked

_HASHES: Dict[Any, int] = {}
#: Keys whose hash is kept (a program's tags repeat; one that makes a new tag per call would
#: otherwise grow the cache to this size before it is cleared).
_HASHES_KEPT = 4096


#: The key hash of an untagged collective ``("c", seq)`` is this bit with ``seq`` below it (its
#: agreement exchange's, ``("c", seq, "agree")``, has :data:`AGREE_HASH` too): computed without
#: hashing, the same in native code (the program executor over shared memory takes it as a
#: number). Every other key's hash has both bits clear.
UNTAGGED_HASH = 1 << 63
AGREE_HASH = 1 << 62
_SEQ_BITS = AGREE_HASH - 1


def untagged_hash(seq: int, agree: bool = False) -> int:
    """The key hash of untagged collective number ``seq`` (of its agreement exchange if ``agree``)."""
    return UNTAGGED_HASH | (AGREE_HASH if agree else 0) | (seq & _SEQ_BITS)


def key_hash(prefix: Hashable) -> int:
    """A 64-bit hash of a message key (prefix), equal on every rank: computed from its ``repr``,
    so user tags must be built from strings, numbers and tuples; an untagged collective's is
    :func:`untagged_hash` of its number."""
    if type(prefix) is tuple and len(prefix) in (2, 3) and prefix[0] == "c" and type(prefix[1]) is int:
        if len(prefix) == 2:
            return UNTAGGED_HASH | (prefix[1] & _SEQ_BITS)
        if prefix[2] == "agree":
            return UNTAGGED_HASH | AGREE_HASH | (prefix[1] & _SEQ_BITS)
    h = _HASHES.get(prefix)
    if h is None:
        if len(_HASHES) >= _HASHES_KEPT:
            _HASHES.clear()
        digest = hashlib.blake2b(repr(prefix).encode(), digest_size=8).digest()
        h = int.from_bytes(digest, "little") & _SEQ_BITS
        _HASHES[prefix] = h
    return h


def split_key(key: Hashable) -> Tuple[Hashable, int, bool]:
    """``(prefix, step, checked)`` of a message key. Untagged collectives ``("c", seq, step)``
    are unchecked (their sequence numbers are unique in flight); every other key is checked."""
    if isinstance(key, tuple) and key and key[0] == "c" and len(key) == 3:
        return key[:2], key[2], False
    if isinstance(key, tuple) and key and key[0] in ("c", "u") and isinstance(key[-1], int):
        return key[:-1], key[-1], True
    return key, 0, True


def too_large(tl: str, nbytes: int, peer: int, tag: Hashable, room: int) -> TransportError:
    """The error of a message that does not fit the receive buffer posted for it."""
    return TransportError(f"{tl}: message of {nbytes} B from rank {peer} (tag {tag!r}) is larger than the "
                          f"receive buffer of {room} B")


def deliver(tl: str, req: TransportRequest, buf: np.ndarray, data: np.ndarray,
            traffic: Optional[Traffic] = None) -> None:
    """Complete receive ``req`` with a message held in ``data``: copied into ``buf`` (and counted
    as received from ``req.peer`` in ``traffic``), or the too-large error if it does not fit."""
    n = data.nbytes
    if n > buf.nbytes:
        req.error = too_large(tl, n, req.peer, req.tag, buf.nbytes)
    else:
        buf[:n] = data
        req.nbytes = n
        if traffic is not None:
            traffic.received(req.peer, n)
    req.done = True


class Traffic:
    """What one transport moved, per peer: bytes and messages sent and received.

    Peers are numbered as the transport numbers them (team ranks for a team's transport); ``rank``
    is the transport's own rank (messages to itself count under it), None if unknown. Payload
    bytes only (see the module doc). The counters are plain ints updated without a lock: the
    engine calls transports under its context's lock.
    """

    __slots__ = ("rank", "_peers")

    #: Names of a peer's figures, in the order :meth:`snapshot` gives them.
    FIELDS = ("sent", "received", "msgs_sent", "msgs_received")

    def __init__(self, rank: Optional[int] = None) -> None:
        self.rank = rank
        self._peers: Dict[Hashable, List[int]] = {}  # peer -> [sent, received, msgs sent, msgs received]

    def sent(self, peer: Hashable, nbytes: int) -> None:
        """Count a message of ``nbytes`` payload bytes handed to the wire for ``peer``."""
        c = self._peers.get(peer)
        if c is None:
            c = self._peers[peer] = [0, 0, 0, 0]
        c[0] += nbytes
        c[2] += 1

    def add(self, peer: Hashable, counts: Sequence[int]) -> None:
        """Count ``counts`` (sent, received, messages sent, messages received) with ``peer`` at
        once (a native program's, when it completes)."""
        c = self._peers.get(peer)
        if c is None:
            c = self._peers[peer] = [0, 0, 0, 0]
        c[0] += counts[0]  # (unrolled: a repeated small collective's every call counts here)
        c[1] += counts[1]
        c[2] += counts[2]
        c[3] += counts[3]

    def received(self, peer: Hashable, nbytes: int) -> None:
        """Count a completed receive of ``nbytes`` bytes from ``peer``."""
        c = self._peers.get(peer)
        if c is None:
            c = self._peers[peer] = [0, 0, 0, 0]
        c[1] += nbytes
        c[3] += 1

    def snapshot(self, include_self: bool = True) -> Dict[Hashable, Dict[str, int]]:
        """``{peer: {"sent", "received", "msgs_sent", "msgs_received"}}`` (a copy), for the peers
        with any traffic; without the own rank's entry if ``include_self`` is false."""
        fields = self.FIELDS
        return {peer: dict(zip(fields, c)) for peer, c in list(self._peers.items())
                if include_self or peer != self.rank}

    def total(self, include_self: bool = True) -> Dict[str, int]:
        """The four figures summed over peers (the own rank's too unless ``include_self`` is false)."""
        out = [0, 0, 0, 0]
        for peer, c in list(self._peers.items()):
            if include_self or peer != self.rank:
                for i in range(4):
                    out[i] += c[i]
        return dict(zip(self.FIELDS, out))

    def reset(self) -> None:
        """Start counting from zero."""
        self._peers.clear()

    def __repr__(self) -> str:
        t = self.total()
        return (f"<Traffic {len(self._peers)} peers: sent {t['sent']} B in {t['msgs_sent']} msgs, "
                f"received {t['received']} B in {t['msgs_received']} msgs>")


class _TrafficSlot:
    """``Transport.traffic``: each transport's own :class:`Traffic`, made on first use and then an
    instance attribute (a non-data descriptor, so later reads cost a plain attribute lookup)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Optional[type] = None) -> Any:
        if obj is None:
            return self
        traffic = obj.__dict__[self.name] = Traffic(getattr(obj, "rank", None))
        return traffic


class TransportRequest:
    """One outstanding send or receive."""

    __slots__ = ("done", "error", "nbytes", "peer", "tag", "kind")

    def __init__(self, kind: str, peer: int, tag: Hashable, nbytes: int) -> None:
        self.kind = kind
        self.peer = peer
        self.tag = tag
        self.nbytes = nbytes  # bytes of the buffer; for receives, bytes received once done
        self.done = False
        self.error: Optional[BaseException] = None

    def test(self) -> bool:
        """True once finished; raises the transport's error if it failed."""
        if self.error is not None:
            raise self.error
        return self.done

    def cancel(self) -> None:
        """Withdraw the operation if it has not finished (the default can't; transports override)."""

    def __repr__(self) -> str:
        state = "done" if self.done else "pending"
        return f"<{self.kind} peer={self.peer} tag={self.tag!r} {self.nbytes} B {state}>"


class _Unpack(TransportRequest):
    """A marked receive on a transport that does not carry marks itself: the message (mark, then
    payload) lands in ``stage``; once it is there and its mark matches, the payload is copied to
    ``buf``."""

    __slots__ = ("inner", "stage", "buf", "mark", "transport")

    def test(self) -> bool:
        if self.done:
            if self.error is not None:
                raise self.error
            return True
        if self.error is not None:
            raise self.error
        inner = self.inner
        try:
            if not inner.test():
                return False
        except TransportError as exc:  # a message longer than mark and payload: not this call's
            if "larger than the receive buffer" not in str(exc):
                raise
            self.error = self.mark.judge(self.peer, b"", -1, self.buf.nbytes)
            self.done = True
            raise self.error from None
        n = inner.nbytes - MARK_BYTES
        self.transport.traffic.add(self.peer, (0, -MARK_BYTES, 0, 0))  # (marks are no payload)
        if not unmarked(self, self.mark, self.stage[:MARK_BYTES].tobytes(), n, self.buf.nbytes):
            raise self.error  # type: ignore[misc]
        self.buf[:n] = self.stage[MARK_BYTES:MARK_BYTES + n]
        self.nbytes = n
        self.done = True
        return True

    def cancel(self) -> None:
        self.inner.cancel()


class Channel:
    """Point-to-point messaging of one collective: every message is keyed by the collective's
    key plus a step number, so concurrent collectives never match each other's messages.
    Transports may return a subclass that precomputes what the key means on their wire."""

    __slots__ = ("transport", "key", "mark")

    def __init__(self, transport: Transport, key: tuple) -> None:
        self.transport = transport
        self.key = key
        #: The :class:`Mark` every message of the collective carries (None: unmarked), set by
        #: whoever built the collective (a team's planner).
        self.mark: Optional[Mark] = None

    def rekey(self, key: tuple) -> None:
        """Use this channel for another collective (same transport)."""
        self.key = key

    def __repr__(self) -> str:
        return repr(self.key)

    def isend(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        mark = self.mark
        if mark is None:
            return self.transport.isend(buf, peer, (*self.key, step))
        return self.transport.isend_marked(buf, peer, (*self.key, step), mark)

    def irecv(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        mark = self.mark
        if mark is None:
            return self.transport.irecv(buf, peer, (*self.key, step))
        return self.transport.irecv_marked(buf, peer, (*self.key, step), mark)

    def exchange(self, sendbuf: np.ndarray, recvbuf: np.ndarray, peer: int, step: int) -> TransportRequest:
        """Send ``sendbuf`` to ``peer`` and receive ``recvbuf`` from it (MPI_Sendrecv): one
        request done when both are."""
        return _Both(self.isend(sendbuf, peer, step), self.irecv(recvbuf, peer, step))


class _Both(TransportRequest):
    """A send and a receive with one peer, tested together."""

    __slots__ = ("send", "recv")

    def __init__(self, send: TransportRequest, recv: TransportRequest) -> None:
        super().__init__("exchange", send.peer, send.tag, send.nbytes)
        self.send = send
        self.recv = recv

    def test(self) -> bool:
        if not self.done:
            received = self.recv.test()  # (first: a receive that failed raises, its send done or not)
            if self.send.test() and received:
                self.done = True
        return self.done

    def cancel(self) -> None:
        self.send.cancel()
        self.recv.cancel()


#: Arrivals a transport keeps for the engine before it stops listing them (then the engine
#: looks at every credit-blocked collective once).
MAX_ARRIVALS = 1 << 16


class Transport(abc.ABC):
    """Point-to-point messaging among the ranks of one team."""

    #: Short name (``local``, ``self``, ``mpi``, ``shm``, ``ucx``).
    name = "base"

    # Messages that arrived before their receive was posted are counted by *demand id* (what
    # :meth:`demand_id` makes of a collective's key) so that the engine can ask in O(1) whether a
    # peer started a collective; while the engine watches (``_arrivals`` is a list) each such
    # arrival is also listed there. Transports report them with ``unexpected_arrived`` and
    # ``unexpected_taken``; the engine reads them with the methods of "the engine's side" below.
    _unexpected_ids: Optional[Dict[Hashable, int]] = None
    _arrivals: Optional[List[Hashable]] = None
    _arrivals_overflowed = False
    #: The bandwidth limiter this transport's sends wait on (None: no limit; see
    #: :func:`pycoll.tl.limit.limit_sends`).
    limiter: Optional[Any] = None
    #: Bytes and messages this transport sent and received, per peer (see the module doc).
    traffic: Traffic = _TrafficSlot()  # type: ignore[assignment]
    #: Whether its native programs (``program_task``, where it has them) carry marks.
    program_marks = False

    @abc.abstractmethod
    def isend(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        """Start sending the bytes of ``buf`` (a uint8 view) to team rank ``peer``."""

    @abc.abstractmethod
    def irecv(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        """Start receiving a message of at most ``buf.nbytes`` bytes from ``peer`` into ``buf``."""

    def isend_marked(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Mark) -> TransportRequest:
        """Send ``buf`` behind ``mark`` (see the module doc). This fallback packs both into one
        buffer (a copy) and sends it with :meth:`isend`; transports that carry marks override it."""
        stage = np.empty(MARK_BYTES + buf.nbytes, np.uint8)
        stage[:MARK_BYTES] = mark.buf
        stage[MARK_BYTES:] = buf
        req = self.isend(stage, peer, tag)
        self.traffic.add(peer, (-MARK_BYTES, 0, 0, 0))  # (marks are no payload)
        return req

    def irecv_marked(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Mark) -> TransportRequest:
        """Receive a message sent with :meth:`isend_marked` into ``buf``, comparing its mark with
        ``mark`` (see the module doc). This fallback receives into a buffer of its own and copies
        the payload out; transports that carry marks override it."""
        req = _Unpack("recv", peer, tag, buf.nbytes)
        req.stage = np.empty(MARK_BYTES + buf.nbytes, np.uint8)
        req.buf, req.mark, req.transport = buf, mark, self
        req.inner = self.irecv(req.stage, peer, tag)
        return req

    def probe(self, peer: int, tag: Hashable) -> bool:
        """Whether a message from ``peer`` with ``tag`` arrived and waits for its receive (for
        receives from any source: the task probes each peer, then receives from the one found).
        Transports that cannot tell say so with a :class:`TransportError`."""
        raise TransportError(f"{self.name}: this transport cannot probe, so it has no receive from any "
                             "source")

    def channel(self, key: tuple) -> Channel:
        """A channel for the messages of the collective with message key ``key``."""
        return Channel(self, key)

    def progress(self) -> int:
        """Move pending messages; return how many operations finished (0: idle)."""
        return 0

    # ------------------------------------------------------------------ the engine's side
    # A credit-blocked collective starts at once when a peer already started it (a message of it
    # arrived before its receive): the engine asks these, never the transport's fields.
    def demand_id(self, key: tuple) -> Hashable:
        """The id under which unexpected messages of the collective with message key ``key``
        (every tag ``(*key, step)``) are counted."""
        return key_hash(key)

    def poll_unexpected(self) -> None:  # noqa: B027 - optional: most transports count as they go
        """Take in messages that arrived without a posted receive, so that they are counted
        (transports that learn of messages only when asked override this)."""

    def has_unexpected(self, key: tuple) -> bool:
        """Whether a message whose tag is ``(*key, step)`` arrived and waits for its receive
        (a peer has started that collective). The engine asks this of credit-blocked work."""
        self.poll_unexpected()
        ids = self._unexpected_ids
        return bool(ids) and self.demand_id(key) in ids

    def has_unexpected_id(self, did: Hashable) -> bool:
        """Whether messages of demand id ``did`` wait for their receive (as counted so far)."""
        ids = self._unexpected_ids
        return bool(ids) and did in ids

    def watch_arrivals(self) -> None:
        """Start listing the demand ids of unexpected arrivals for :meth:`take_arrivals` (the engine
        calls it when it first watches a credit-blocked collective on this transport)."""
        self._arrivals = []
        self._arrivals_overflowed = False

    def unwatch_arrivals(self) -> None:
        """Stop listing arrivals (the engine watches nothing on this transport any more)."""
        self._arrivals = None
        self._arrivals_overflowed = False

    def take_arrivals(self) -> Optional[Sequence[Hashable]]:
        """The demand ids of unexpected messages that arrived since the last call (in order, with
        repeats; empty while nobody watches), and None if more arrived than :data:`MAX_ARRIVALS`
        could list (then the engine looks at every collective it watches); starts a new list."""
        arrived = self._arrivals
        if self._arrivals_overflowed:
            self._arrivals = []
            self._arrivals_overflowed = False
            return None
        if arrived:
            self._arrivals = []
            return arrived
        return ()  # the usual case, when the engine looks again on every pass: no allocation

    # ------------------------------------------------------------------ the transport's side
    def unexpected_arrived(self, did: Hashable) -> None:
        """Count a message of demand id ``did`` that arrived before its receive was posted (every
        transport calls it as it stashes such a message)."""
        ids = self._unexpected_ids
        if ids is None:
            ids = self._unexpected_ids = {}
        ids[did] = ids.get(did, 0) + 1
        arrivals = self._arrivals
        if arrivals is not None:
            if len(arrivals) < MAX_ARRIVALS:
                arrivals.append(did)
            else:
                self._arrivals_overflowed = True

    def unexpected_taken(self, did: Hashable) -> None:
        """Uncount an unexpected message of demand id ``did`` that a receive took (every transport
        calls it as a receive takes a stashed message)."""
        ids = self._unexpected_ids
        left = ids[did] - 1
        if left:
            ids[did] = left
        else:
            del ids[did]

    def stray(self, key: tuple, mark: Mark) -> Optional[Tuple[int, bytes, int]]:
        """A message of the collective of message key ``key`` (any step) that arrived and waits for
        a receive, and carries another mark than ``mark`` (or none): ``(peer, its mark's bytes,
        payload bytes)``, else None. A peer that called another collective here (or the same with
        other arguments) may send messages that no receive of this one takes, so that no receive
        ever compares their marks: the engine's watch asks this of a marked collective that waits
        (:class:`pycoll.agreement.Marks`). Transports that keep unexpected messages override it."""
        return None

    #: The team's look at its peers (:mod:`pycoll.liveness`, set by the bootstrap): the ranks
    #: known to have left, whatever the transport itself can tell, each with the words that name
    #: it in an error (``rank 2 (pid 4242, host n1) has died``). None: none.
    gone: Optional[Callable[[], Dict[int, str]]] = None

    def lost_error(self, peer: int, what: str, exiting: bool = False) -> Optional[PeerLostError]:
        """The PeerLostError of ``what`` (an operation with ``peer`` that failed) if the team's look
        at its peers finds ``peer`` gone, naming it (rank, pid, host); None if not. ``exiting``: the
        transport found the peer's process going (its memory could not be read): looked at again
        for up to a second until its end shows, and lost in any case."""
        deadline = time.monotonic() + (1.0 if exiting and self.gone is not None else 0.0)
        words = None
        while self.gone is not None:
            words = self.gone().get(peer)
            if words is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        if words is None and not exiting:
            return None
        words = words or f"rank {peer} has died"
        pid = re.search(r"\(pid (\d+)", words)
        return PeerLostError(f"{self.name}: {words}: {what}", rank=peer, pid=int(pid[1]) if pid else 0,
                             how=words.split(") ", 1)[-1] if pid else "has died")

    def lost_peers(self) -> Set[int]:
        """The ranks known to have left for good: those the team's look at its peers finds gone
        (:attr:`gone`), and those this transport knows of itself (a closed connection)."""
        gone = self.gone
        return set() if gone is None else set(gone())

    def close(self) -> None:  # noqa: B027 - optional, most transports hold nothing
        """Release the transport's resources."""
