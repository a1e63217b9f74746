"""TCP transport: non-blocking sockets, one per peer, progressed by the engine.

Every message is a 32-byte header then the payload::

    magic u32, version u32, key hash u64 (of the key without its step), step u64, payload bytes u64

The receiver reads eagerly: a payload whose receive is posted goes straight into its buffer;
otherwise it is kept until that receive is posted (so a send always completes, whatever the
receiver is doing, as the transport contract asks). Headers are validated before use; a peer
whose connection closes fails every operation with it, naming the rank.

Traffic (``transport.traffic``, payload bytes, not the 32-byte headers): a send counts in
:meth:`TCPTransport.isend` (the message joins the peer's outgoing queue), a receive when its payload
is complete: in :meth:`TCPTransport._read`, or in ``irecv`` for a message that arrived before it.
"""

from __future__ import annotations

import math
import selectors
import socket
import struct
import time
from collections import defaultdict, deque
from typing import Any, Dict, Hashable, List, Optional, Set, Tuple

import numpy as np

from pycoll import config
from pycoll.errors import PeerLostError, TransportError
from pycoll.tl.base import Transport, TransportRequest, deliver, key_hash, limit_sends, split_key, too_large

_HEADER = struct.Struct("<IIQQQ")
_MAGIC = 0x50544350  # "PCTP"
_VERSION = 1
_HELLO = struct.Struct("<IIQ")  # magic, rank, team id
#: The key hash of a ping: an empty message the receiver drops, sent to a peer from which this
#: rank waits while nothing of its own waits for that peer's acknowledgement (see check_silence).
_PING_HASH = 0x50494E4750494E47  # "PINGPING"
_PING = _HEADER.pack(_MAGIC, _VERSION, _PING_HASH, 0, 0)
_MAX_MESSAGE = 1 << 40


class _Send(TransportRequest):
    __slots__ = ("parts",)


class _Recv(TransportRequest):
    __slots__ = ("buf", "k")


class _Peer:
    """One connection: the outgoing queue and the state of the message being read."""

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank = rank
        self.sock = sock
        self.out: deque = deque()  # (request, [memoryview parts])
        self.header = bytearray(_HEADER.size)
        self.hgot = 0
        self.target: Optional[memoryview] = None
        self.tgot = 0
        self.recv: Optional[_Recv] = None  # the receive being filled, or None: stash
        self.k: Tuple[int, int] = (0, 0)
        self.data: Optional[np.ndarray] = None
        self.pinged = 0.0  # when this rank last pinged the peer (time.monotonic())
        self.unacked_since: Optional[float] = None  # since when data of ours has waited for its ACK
        self.error: Optional[TransportError] = None


#: ``struct tcp_info`` (linux/tcp.h) up to ``tcpi_last_ack_recv``: eight one-byte fields (state,
#: ca_state, retransmits, probes, ...), then rto, ato, snd_mss, rcv_mss, unacked, sacked, lost,
#: retrans, fackets, last_data_sent, last_ack_sent, last_data_recv, last_ack_recv (u32; the last
#: four in ms ago).
_TCP_INFO = struct.Struct("<8B13I")
_PROBES, _UNACKED, _LAST_ACK_RECV = 3, 12, 20


def unanswered_ms(sock: socket.socket) -> Optional[int]:
    """How long the peer's host has left us without an ACK: ms since its last one while segments
    of ours, or window probes (its receive buffer full: a rank that does not read), wait for one;
    None when none waits (or the kernel does not say)."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    except (OSError, AttributeError):
        return None
    if len(raw) < _TCP_INFO.size:
        return None
    info = _TCP_INFO.unpack(raw)
    return info[_LAST_ACK_RECV] if info[_UNACKED] or info[_PROBES] else None


class TCPTransport(Transport):
    """Point-to-point over a mesh of TCP connections (see :func:`connect_mesh`)."""

    name = "tcp"

    def __init__(self, rank: int, size: int, socks: Dict[int, socket.socket]) -> None:
        self.rank = rank
        self.size = size
        self.peers: Dict[int, _Peer] = {}
        self.selector = selectors.DefaultSelector()
        silence = config.get("PYCOLL_PEER_SILENCE")
        #: Seconds a peer's host may leave our data unacknowledged (see :meth:`check_silence`).
        self.silence = max(1.0, silence) if silence < math.inf else math.inf
        self._looked = 0.0  # when check_silence last ran
        for r, sock in socks.items():
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(r, sock)
            self.peers[r] = peer
            self.selector.register(sock, selectors.EVENT_READ, peer)
        self._posted: Dict[Tuple[int, int, int], deque] = defaultdict(deque)
        self._stash: Dict[Tuple[int, int, int], deque] = defaultdict(deque)
        self._sending: List[_Peer] = []
        limit_sends(self)

    def _peer(self, peer: int) -> _Peer:
        p = self.peers.get(peer)
        if p is None:
            raise ValueError(f"tcp: peer {peer} is not another rank of a team of {self.size}")
        if p.error is not None:
            raise p.error
        return p

    # ------------------------------------------------------------------ sends
    def isend(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        p = self._peer(peer)
        prefix, step, _ = split_key(tag)
        header = _HEADER.pack(_MAGIC, _VERSION, key_hash(prefix), step, buf.nbytes)
        req = _Send("send", peer, tag, buf.nbytes)
        req.parts = [memoryview(header), memoryview(buf).cast("B")]
        self.traffic.sent(peer, buf.nbytes)
        p.out.append(req)
        if len(p.out) == 1:
            self._flush(p)
            if p.out:
                self._sending.append(p)
        return req

    def _flush(self, p: _Peer) -> int:
        """Write what the socket takes; return how many sends completed."""
        done = 0
        while p.out:
            req = p.out[0]
            parts = [part for part in req.parts if part.nbytes]
            if parts:
                try:
                    n = p.sock.sendmsg(parts)
                except (BlockingIOError, InterruptedError):
                    return done
                except OSError as exc:
                    self._lost(p, f"no longer accepts data ({exc})")
                    return done
                for i, part in enumerate(parts):
                    if n >= part.nbytes:
                        n -= part.nbytes
                        parts[i] = part[part.nbytes:]
                    else:
                        parts[i] = part[n:]
                        break
                req.parts = [part for part in parts if part.nbytes]
                if req.parts:
                    return done
            req.done = True
            p.out.popleft()
            done += 1
        return done

    # ------------------------------------------------------------------ receives
    def irecv(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        prefix, step, _ = split_key(tag)
        k = (peer, key_hash(prefix), step)
        req = _Recv("recv", peer, tag, buf.nbytes)
        req.buf = buf
        req.k = k
        stashed = self._stash.get(k)
        if stashed:  # arrived before the receive (perhaps before the peer closed: still good)
            data = stashed.popleft()
            if not stashed:
                del self._stash[k]
            self.unexpected_taken(k[1])
            deliver("tcp", req, req.buf, data, self.traffic)
            return req
        p = self._peer(peer)
        if p.recv is None and p.data is not None and (peer, *p.k) == k and p.target is not None:
            # the payload is arriving right now into a temporary buffer: take it over
            if p.data.nbytes <= buf.nbytes:
                buf[:p.tgot] = p.data[:p.tgot]
                p.target = memoryview(buf).cast("B")[:p.data.nbytes]
                p.recv, p.data = req, None
                req.nbytes = p.target.nbytes
                return req
        self._posted[k].append(req)
        self.progress()
        return req

    def probe(self, peer: int, tag: Hashable) -> bool:
        p = self._peer(peer)
        self.progress()
        prefix, step, _ = split_key(tag)
        k = (peer, key_hash(prefix), step)
        if self._stash.get(k):
            return True
        return p.recv is None and p.data is not None and p.target is not None and (peer, *p.k) == k

    def _read(self, p: _Peer) -> int:
        """Read what the socket has; return how many receives completed."""
        done = 0
        while True:
            try:
                if p.target is None:
                    n = p.sock.recv_into(memoryview(p.header)[p.hgot:])
                else:
                    n = p.sock.recv_into(p.target[p.tgot:]) if p.target.nbytes > p.tgot else -1
            except (BlockingIOError, InterruptedError):
                return done
            except OSError as exc:
                self._lost(p, f"broke the connection ({exc})")
                return done
            if n == 0:
                self._lost(p, "closed its connection")
                return done
            if p.target is None:
                p.hgot += n
                if p.hgot < _HEADER.size:
                    continue
                p.hgot = 0
                magic, version, khash, step, nbytes = _HEADER.unpack(p.header)
                if magic != _MAGIC or version != _VERSION or nbytes > _MAX_MESSAGE:
                    self._lost(p, f"sent a malformed header (magic {magic:#x}, version {version}, "
                                  f"{nbytes} B)")
                    return done
                if khash == _PING_HASH and not step and not nbytes:  # a ping: nothing to deliver
                    continue
                p.k = (khash, step)
                queue = self._posted.get((p.rank, khash, step))
                recv = queue.popleft() if queue else None
                if queue is not None and not queue:
                    del self._posted[(p.rank, khash, step)]
                if recv is not None and nbytes > recv.buf.nbytes:
                    recv.error = too_large("tcp", nbytes, p.rank, recv.tag, recv.buf.nbytes)
                    recv.done = True
                    recv = None
                p.recv = recv
                if recv is not None:
                    p.target = memoryview(recv.buf).cast("B")[:nbytes]
                    recv.nbytes = nbytes
                else:
                    p.data = np.empty(nbytes, np.uint8)
                    p.target = memoryview(p.data)
                p.tgot = 0
                if nbytes:
                    continue
            else:
                if n > 0:
                    p.tgot += n
                if p.tgot < p.target.nbytes:
                    continue
            if p.recv is not None:
                p.recv.done = True
                self.traffic.received(p.rank, p.recv.nbytes)
                done += 1
            else:
                self._stash[(p.rank, *p.k)].append(p.data)
                self.unexpected_arrived(p.k[0])
            p.target, p.recv, p.data = None, None, None

    def _lost(self, p: _Peer, what: str) -> None:
        err = PeerLostError(f"tcp: lost rank {p.rank}: it {what}", rank=p.rank, how=what)
        p.error = err
        try:
            self.selector.unregister(p.sock)
        except (KeyError, ValueError):
            pass
        p.sock.close()
        for req in p.out:
            req.error = err
        p.out.clear()
        if p.recv is not None:
            p.recv.error = err
        for k, queue in list(self._posted.items()):
            if k[0] == p.rank:
                for req in queue:
                    req.error = err
                del self._posted[k]

    # ------------------------------------------------------------------ engine side
    def progress(self) -> int:
        moved = 0
        if self._sending:
            for p in self._sending:
                moved += self._flush(p)
            self._sending = [p for p in self._sending if p.out]
        for key, _ in self.selector.select(0):
            moved += self._read(key.data)
        return moved

    def poll_unexpected(self) -> None:
        self.progress()

    def check_silence(self) -> bool:
        """Lose every peer whose host has acknowledged nothing for :attr:`silence` seconds while
        data of ours (or a window probe) has waited for its ACK at least half that, and ping the
        others that have nothing of ours to acknowledge (the engine's watch while it waits, called
        under its lock: it writes to the peers' queues). True: go on watching.

        Waiting half the silence keeps a live host whose ACK is merely late (the first after an
        idle spell, when the last one is old) from being lost; counting from the last ACK finds a
        host cut off while our data waited behind its full window (the kernel's window probes
        then go unanswered) as soon as one cut off while data flowed."""
        now = time.monotonic()
        if now - self._looked > self.silence / 6:
            # the watch did not run for a while (this rank computed, or was stopped): what it saw
            # waiting then says nothing about now
            for p in self.peers.values():
                p.unacked_since = None
        self._looked = now
        for p in self.peers.values():
            if p.error is not None:
                continue
            ms = unanswered_ms(p.sock)
            if ms is not None:
                if p.unacked_since is None:
                    p.unacked_since = now  # (first seen waiting: data sent since the last look)
                silent = ms / 1000
                if silent > self.silence and now - p.unacked_since >= self.silence / 2:
                    self._lost(p, f"stopped answering: its host acknowledged nothing for {silent:.1f} s "
                                  "(gone, or cut off the network)")
                continue
            p.unacked_since = None
            if not p.out and now - p.pinged > self.silence / 6:
                # nothing of ours waits for its acknowledgement: a ping gives its host something to
                # acknowledge (a host cut off just after the last ping was acknowledged is lost
                # within the silence: the next ping waits from silence / 6 to silence)
                p.pinged = p.unacked_since = now
                req = _Send("send", p.rank, ("ping",), 0)
                req.parts = [memoryview(_PING)]
                p.out.append(req)
                self._sending.append(p)
                self._flush(p)
                self._sending = [q for q in self._sending if q.out]
        return self.silence < math.inf and not self.closed

    def lost_peers(self) -> Set[int]:
        """The ranks whose connection closed or broke (their process exited or was killed, or
        they closed the team), as far as the reads so far have seen."""
        return {p.rank for p in self.peers.values() if p.error is not None}

    closed = False

    def close(self) -> None:
        self.closed = True
        for p in self.peers.values():
            try:
                self.selector.unregister(p.sock)
            except (KeyError, ValueError):
                pass
            p.sock.close()
        self.selector.close()


def connect_mesh(rank: int, size: int, exchange: Any, team_id: int, host: str = "0.0.0.0",
                 advertise: Optional[str] = None, timeout: float = 60.0) -> Dict[int, socket.socket]:
    """Connect every pair of ranks: rank j connects to every i < j, which accepts.

    ``exchange(value: bytes) -> list[bytes]`` allgathers the listening addresses (through the
    store). Every connection starts with a hello naming the rank and the team, checked on accept.
    """
    listener = socket.create_server((host, 0), backlog=max(16, size))
    port = listener.getsockname()[1]
    addr = advertise or "127.0.0.1"
    addrs = [a.decode().rsplit(":", 1) for a in exchange(f"{addr}:{port}".encode())]
    socks: Dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout
    for i in range(rank):
        while True:
            try:
                s = socket.create_connection((addrs[i][0], int(addrs[i][1])), timeout=timeout)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TransportError(f"tcp: cannot connect to rank {i} at {addrs[i]}") from None
                time.sleep(0.05)
        s.sendall(_HELLO.pack(_MAGIC, rank, team_id))
        socks[i] = s
    listener.settimeout(max(1.0, deadline - time.monotonic()))
    while len(socks) < size - 1:
        try:
            s, _ = listener.accept()
        except TimeoutError:
            raise TransportError(f"tcp: rank {rank}: only {len(socks)} of {size - 1} peers connected "
                                 f"within {timeout:g} s") from None
        s.settimeout(timeout)
        hello = b""
        while len(hello) < _HELLO.size:
            chunk = s.recv(_HELLO.size - len(hello))
            if not chunk:
                break
            hello += chunk
        if len(hello) != _HELLO.size:
            s.close()
            continue
        magic, peer, tid = _HELLO.unpack(hello)
        if magic != _MAGIC or tid != team_id or not rank < peer < size or peer in socks:
            s.close()  # a stranger or a stale connection: ignore it
            continue
        socks[peer] = s
    listener.close()
    return socks
