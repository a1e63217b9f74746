"""The bandwidth limit (``PYCOLL_BW_LIMIT``, for experiments): one token bucket per process that
the transports' sends wait on, as they would on one NIC.

Every transport calls :func:`limit_sends` once at the end of its constructor. With no limit set
that does nothing (no cost per message); with one, it routes the transport's sends through the
process's :class:`BandwidthLimiter`, one token bucket shared by every team and transport of the
process as one NIC would be: ``isend`` hands a message of n bytes to the real transport only once
the bucket holds n bytes of tokens, in the order sends were posted, and otherwise returns a
deferred request that looks like any other (``test``, ``cancel``); the transport's ``progress``
releases what the bucket allows, so a send nobody tests still goes out. Receives are not limited,
nor are sends to the rank itself, nor collectives that move data through the shared segment or a
peer's memory directly (the shm algorithms of untagged calls, the cma allgather's reads): limited
runs use PYCOLL_TLS without shm (or tagged collectives, which never use the segment algorithms; the
cma allgather they may).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from typing import Callable, Hashable, Optional

import numpy as np

from pycoll import config
from pycoll.errors import TransportError
from pycoll.tl.base import Channel, Transport, TransportRequest
from pycoll.tl.marks import Mark

#: The smallest burst of the bandwidth limiter's bucket (it also holds at least 1 ms of its rate).
BURST_BYTES = 64 << 10


class _Deferred(TransportRequest):
    """A send the bandwidth limiter holds until its bytes are in the bucket; then it stands for the
    transport's own request (``real``)."""

    __slots__ = ("limiter", "transport", "send", "buf", "real")

    def test(self) -> bool:
        if self.error is not None:  # (first: a receive may be done with an error, see unmarked)
            raise self.error
        if self.done:
            return True
        real = self.real
        if real is None:
            self.limiter.release()
            real = self.real
            if real is None:
                if self.error is not None:  # the transport refused it when released
                    raise self.error
                return False
        try:
            done = real.test()
        except BaseException as exc:
            self.error = exc
            raise
        if done:
            self.done = True
        return done

    def cancel(self) -> None:
        if self.real is not None:
            self.real.cancel()
        elif not self.done:
            self.limiter.drop(self)


class BandwidthLimiter:
    """A token bucket refilled at ``rate`` bytes per second that sends wait on, first posted first
    released (a NIC's queue: the engine's priority and credit decide the posting order).

    A message of n bytes is released once the bucket holds n bytes of tokens, which it then takes.
    The bucket holds at most ``burst`` (:data:`BURST_BYTES` or 1 ms of the rate, the larger) while
    no send waits; while sends wait the link is busy and tokens accrue for them without that cap,
    so a message larger than the burst is never stuck and a late look at the bucket (the engine
    backs off up to a millisecond when idle) costs no bandwidth. Messages of 0 bytes need no tokens
    (but keep their place in the queue, so messages with one tag still match in order).

    ``clock`` (seconds, monotonic) is for tests.
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0:
            raise ValueError(f"bandwidth limit must be > 0 bytes/s, got {rate!r}")
        self.clock = clock
        self.queue: deque = deque()  # deferred sends, in posting order
        self.lock = threading.RLock()
        self.set_rate(rate)
        self.tokens = self.burst
        self.last = clock()

    def set_rate(self, rate: float) -> None:
        """Change the rate (for sends from now on)."""
        self.rate = float(rate)
        self.burst = max(float(BURST_BYTES), self.rate * 1e-3)

    def __repr__(self) -> str:
        return f"<BandwidthLimiter {self.rate:.0f} B/s, {len(self.queue)} sends waiting>"

    def _refill(self) -> None:
        now = self.clock()
        self.tokens += (now - self.last) * self.rate
        self.last = now
        if not self.queue and self.tokens > self.burst:  # an idle link saves no more than a burst
            self.tokens = self.burst

    def send(self, transport: Transport, isend: Callable[..., TransportRequest], buf: np.ndarray, peer: int,
             tag: Hashable) -> TransportRequest:
        """``isend(buf, peer, tag)`` (the transport's own) now if the bucket allows and no send
        waits, else a deferred request released in order by :meth:`release`."""
        n = buf.nbytes
        with self.lock:
            if self.queue:
                self._release()  # so that tokens accrued for earlier sends are not this one's
            else:
                self._refill()
            if not self.queue and self.tokens >= n:
                self.tokens -= n
                return isend(buf, peer, tag)  # errors (a bad peer, a lost one) are raised at once
            req = _Deferred("send", peer, tag, n)
            req.limiter, req.transport, req.send, req.buf, req.real = self, transport, isend, buf, None
            self.queue.append(req)
            return req

    def release(self) -> int:
        """Hand the transports the waiting sends the bucket now allows; return how many."""
        if not self.queue:
            return 0
        with self.lock:
            return self._release()

    def _release(self) -> int:
        self._refill()
        queue, moved = self.queue, 0
        while queue:
            req = queue[0]
            if req.send is None:  # canceled
                queue.popleft()
                continue
            if self.tokens < req.nbytes:
                break
            queue.popleft()
            self.tokens -= req.nbytes
            isend, buf = req.send, req.buf
            req.send = req.buf = None
            try:
                req.real = isend(buf, req.peer, req.tag)
            except Exception as exc:
                req.error = exc
            moved += 1
        if not queue and self.tokens > self.burst:
            self.tokens = self.burst
        return moved

    def drop(self, req: _Deferred) -> None:
        """Withdraw a send not yet released (cancel)."""
        with self.lock:
            req.send = req.buf = None

    def forget(self, transport: Transport) -> None:
        """``transport`` closes: its sends not yet released fail."""
        with self.lock:
            for req in self.queue:
                if req.transport is transport and req.send is not None:
                    req.send = req.buf = None
                    req.error = TransportError(f"{transport.name}: transport closed before the bandwidth "
                                               f"limiter released its send to rank {req.peer}")

    def attach(self, transport: Transport) -> None:
        """Route ``transport``'s sends through this bucket (see :func:`limit_sends`)."""
        isend, progress, close = transport.isend, transport.progress, transport.close
        rank = getattr(transport, "rank", None)

        def limited_isend(buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
            if peer == rank:  # a rank's messages to itself do not cross the network
                return isend(buf, peer, tag)
            return self.send(transport, isend, buf, peer, tag)

        def limited_progress() -> int:
            return self.release() + progress()

        if type(transport).isend_marked is not Transport.isend_marked:  # (the fallback sends with isend)
            isend_marked = transport.isend_marked

            def limited_isend_marked(buf: np.ndarray, peer: int, tag: Hashable,
                                     mark: Mark) -> TransportRequest:
                send = functools.partial(_send_marked, isend_marked, mark)
                if peer == rank:
                    return send(buf, peer, tag)
                return self.send(transport, send, buf, peer, tag)

            transport.isend_marked = limited_isend_marked  # type: ignore[method-assign]

        def limited_close() -> None:
            self.forget(transport)
            close()

        # Instance attributes shadow the class's methods. Channels: the plain one, whose sends go
        # through ``transport.isend`` (the MPI and UCX channels' fast paths would bypass it; they
        # put the same bytes on the wire, so ranks with and without a limit still match).
        transport.isend = limited_isend  # type: ignore[method-assign]
        transport.progress = limited_progress  # type: ignore[method-assign]
        transport.close = limited_close  # type: ignore[method-assign]
        transport.channel = functools.partial(Channel, transport)  # type: ignore[method-assign]
        transport.limiter = self


def _send_marked(isend_marked: Callable[..., TransportRequest], mark: Mark, buf: np.ndarray, peer: int,
                 tag: Hashable) -> TransportRequest:
    """``isend_marked(buf, peer, tag, mark)``, as the bandwidth limiter calls a send."""
    return isend_marked(buf, peer, tag, mark)


_LIMITER: Optional[BandwidthLimiter] = None
_LIMITER_LOCK = threading.Lock()


def bandwidth_limiter() -> Optional[BandwidthLimiter]:
    """The process's bandwidth limiter if ``PYCOLL_BW_LIMIT`` sets a limit now, else None (one
    bucket per process: a later transport made under another limit changes its rate)."""
    rate = config.get("PYCOLL_BW_LIMIT")
    if not rate:
        return None
    global _LIMITER
    with _LIMITER_LOCK:
        if _LIMITER is None:
            _LIMITER = BandwidthLimiter(rate)
        elif _LIMITER.rate != rate:
            with _LIMITER.lock:
                _LIMITER.set_rate(rate)
        return _LIMITER


def limit_sends(transport: Transport) -> Optional[BandwidthLimiter]:
    """Put ``transport`` under the process's bandwidth limit if ``PYCOLL_BW_LIMIT`` sets one (each
    transport calls this once, at the end of its constructor); return the limiter or None."""
    limiter = bandwidth_limiter()
    if limiter is not None:
        limiter.attach(transport)
    return limiter
