"""In-process transport for ``pycoll.local_teams``: every rank lives in this process.

A :class:`LocalFabric` holds, per (destination, source, tag), the queue of receives posted and not
yet matched, and the queue of messages sent before their receive was posted (copied, so the send
completes at once). Matching is FIFO per (source, destination, tag), as in MPI.

Traffic (``transport.traffic``): a send counts on the sender's transport when posted (it is handed
to the receiver's queue at once), a receive on the receiver's when its message is copied in, in
:meth:`LocalFabric.deliver` or :meth:`LocalFabric.match` (where every receive completes).
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Dict, Hashable, Optional, Tuple

import numpy as np

from pycoll.tl.base import (
    Transport,
    TransportRequest,
    deliver,
    key_hash,
    split_key,
)
from pycoll.tl.limit import BandwidthLimiter, limit_sends
from pycoll.tl.marks import MARK_BYTES, Mark


class _LocalRecv(TransportRequest):
    __slots__ = ("buf", "fabric", "key")

    def test(self) -> bool:
        if not self.done and self.fabric.limiter is not None:
            # the engine polls no local transport: a waiting receive lets the limiter release sends
            self.fabric.limiter.release()
        return super().test()

    def cancel(self) -> None:
        if not self.done:
            self.fabric.withdraw(self)


class LocalFabric:
    """The shared message store of ``size`` in-process ranks."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._posted: Dict[Tuple[int, int, Hashable], deque] = defaultdict(deque)
        self._unexpected: Dict[Tuple[int, int, Hashable], deque] = defaultdict(deque)
        self.bytes_sent = [0] * size
        self.messages_sent = [0] * size
        self.transports: Dict[int, LocalTransport] = {}
        #: The bandwidth limiter of the ranks' sends (PYCOLL_BW_LIMIT; None: no limit).
        self.limiter: Optional[BandwidthLimiter] = None

    def transport(self, rank: int) -> LocalTransport:
        t = self.transports[rank] = LocalTransport(self, rank)
        return t

    def deliver(self, src: int, dst: int, tag: Hashable, data: np.ndarray) -> None:
        key = (dst, src, tag)
        self.bytes_sent[src] += data.nbytes
        self.messages_sent[src] += 1
        posted = self._posted.get(key)
        if posted:
            req = posted.popleft()
            if not posted:
                del self._posted[key]
            deliver("local", req, req.buf, data, self.transports[dst].traffic)
        else:
            self._unexpected[key].append(data.copy())
            self.transports[dst].unexpected_arrived(key_hash(split_key(tag)[0]))

    def match(self, req: _LocalRecv) -> None:
        queue = self._unexpected.get(req.key)
        if queue:
            data = queue.popleft()
            if not queue:
                del self._unexpected[req.key]
            receiver = self.transports[req.key[0]]
            receiver.unexpected_taken(key_hash(split_key(req.key[2])[0]))
            deliver("local", req, req.buf, data, receiver.traffic)
        else:
            self._posted[req.key].append(req)

    def withdraw(self, req: _LocalRecv) -> None:
        """Take back a posted receive that has not matched (cancel)."""
        queue = self._posted.get(req.key)
        if queue is not None and req in queue:
            queue.remove(req)

    def has_message(self, dst: int, src: int, tag: Hashable) -> bool:
        """Whether a message from ``src`` to ``dst`` with ``tag`` waits for its receive (probe)."""
        return bool(self._unexpected.get((dst, src, tag)))

    def waiting(self, dst: int) -> list:
        """``(source, tag, data)`` of every message sent to ``dst`` that waits for its receive."""
        return [(src, tag, data) for (d, src, tag), q in self._unexpected.items() if d == dst for data in q]

    def pending_messages(self) -> int:
        """Messages sent and not yet received (for tests: 0 after every collective)."""
        return sum(len(q) for q in self._unexpected.values())


class LocalTransport(Transport):
    """One rank's end of a :class:`LocalFabric`."""

    name = "local"

    def __init__(self, fabric: LocalFabric, rank: int) -> None:
        self.fabric = fabric
        self.rank = rank
        limiter = limit_sends(self)
        if limiter is not None:
            fabric.limiter = limiter

    def isend(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        if not 0 <= peer < self.fabric.size:
            raise ValueError(f"local: peer {peer} is not a rank of a team of {self.fabric.size}")
        req = TransportRequest("send", peer, tag, buf.nbytes)
        self.traffic.sent(peer, buf.nbytes)
        self.fabric.deliver(self.rank, peer, tag, buf)
        req.done = True
        return req

    def probe(self, peer: int, tag: Hashable) -> bool:
        return self.fabric.has_message(self.rank, peer, tag)

    def stray(self, key: tuple, mark: Mark) -> Optional[Tuple[int, bytes, int]]:
        for src, tag, data in self.fabric.waiting(self.rank):  # (marked: the mark, then the payload)
            if isinstance(tag, tuple) and tag[:-1] == key and data[:MARK_BYTES].tobytes() != mark.blob:
                return src, data[:MARK_BYTES].tobytes(), data.nbytes - MARK_BYTES
        return None

    def irecv(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        if not 0 <= peer < self.fabric.size:
            raise ValueError(f"local: peer {peer} is not a rank of a team of {self.fabric.size}")
        req = _LocalRecv("recv", peer, tag, buf.nbytes)
        req.buf = buf
        req.fabric = self.fabric
        req.key = (self.rank, peer, tag)
        self.fabric.match(req)
        return req
