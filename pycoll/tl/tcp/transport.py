"""TCP transport: non-blocking sockets, one per peer, progressed by the engine.

Every message is a 64-byte header then the payload::

    magic u32, version u32, key hash u64 (of the key without its step), step u64, payload bytes u64,
    mark (32 bytes: a marked message's, see :mod:`pycoll.tl.base`; zeros when the version says none)

The receiver reads eagerly: a payload whose receive is posted goes straight into its buffer;
otherwise it is kept until that receive is posted (so a send always completes, whatever the
receiver is doing, as the transport contract asks). Headers are validated before use; a peer
whose connection closes fails every operation with it, naming the rank.

Traffic (``transport.traffic``, payload bytes, not the 64-byte headers): a send counts in
:meth:`TCPTransport.isend` (the message joins the peer's outgoing queue), a receive when its payload
is complete: in :meth:`TCPTransport._read`, or in ``irecv`` for a message that arrived before it.

The mesh (:func:`connect_mesh`) listens on the address it advertises only, and takes a connection
as a peer's only after its hello: the magic, the rank, the team's random id and a MAC of them with
the job's key (:mod:`pycoll.auth`), which :func:`read_hello` checks. A connection that says
something else, or nothing within :data:`HELLO_S`, is dropped and logged; the others go on.
"""

from __future__ import annotations

import hmac
import logging
import math
import selectors
import socket
import struct
import time
from collections import defaultdict, deque
from typing import Any, Callable, Dict, Hashable, List, Optional, Set, Tuple

import numpy as np

from pycoll import config
from pycoll.auth import Seal
from pycoll.errors import OUT_OF_STEP_WORDS, MismatchError, PeerLostError, TransportError
from pycoll.tl.base import (
    Transport,
    TransportRequest,
    deliver,
    key_hash,
    split_key,
    too_large,
)
from pycoll.tl.limit import limit_sends
from pycoll.tl.marks import MARK_BYTES, Mark, unmarked

_HEADER = struct.Struct("<IIQQQ32s")
_MAGIC = 0x50544350  # "PCTP"
_VERSION = 2  # (and _VERSION | _MARKED: the header carries a mark)
_MARKED = 1 << 16
_NO_MARK = bytes(MARK_BYTES)
_HELLO = struct.Struct("<II16s16s")  # magic, rank, team id, MAC (pycoll.auth)
#: Seconds a connection to the mesh's listener has to say its hello before it is dropped.
HELLO_S = 10.0
log = logging.getLogger("pycoll")
#: The key hash of a ping: an empty message the receiver drops, sent to a peer from which this
#: rank waits while nothing of its own waits for that peer's acknowledgement (see check_silence).
_PING_HASH = 0x50494E4750494E47  # "PINGPING"
_PING = _HEADER.pack(_MAGIC, _VERSION, _PING_HASH, 0, 0, _NO_MARK)
#: The longest a rank waits for its sends to go out when it tells news or closes (s).
FLUSH_S = 1.0
#: The key hash of news (see :meth:`TCPTransport.tell`), and its longest payload.
_NEWS_HASH = 0x4E4557534E455753  # "NEWSNEWS"
_MAX_NEWS = 1 << 13
_MAX_MESSAGE = 1 << 40


class _Send(TransportRequest):
    __slots__ = ("parts",)


class _Recv(TransportRequest):
    __slots__ = ("buf", "k", "mark")


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
        self.theirs: Optional[bytes] = None  # the mark of the message being read (None: unmarked)
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
        return self._send(buf, peer, tag, None)

    def isend_marked(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Mark) -> TransportRequest:
        return self._send(buf, peer, tag, mark)

    def _send(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Optional[Mark],
              khash: Optional[int] = None) -> TransportRequest:
        """A send (``mark``: in its header; None: unmarked), behind what the peer's queue holds
        (``khash``: its key hash, instead of the tag's). (isend and isend_marked each call it, so
        that a bandwidth limit wraps each once.)"""
        p = self._peer(peer)
        prefix, step, _ = split_key(tag)
        h = key_hash(prefix) if khash is None else khash
        if mark is None:
            header = _HEADER.pack(_MAGIC, _VERSION, h, step, buf.nbytes, _NO_MARK)
        else:
            header = _HEADER.pack(_MAGIC, _VERSION | _MARKED, h, step, buf.nbytes, mark.blob)
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
        return self.irecv_marked(buf, peer, tag, None)

    def irecv_marked(self, buf: np.ndarray, peer: int, tag: Hashable,
                     mark: Optional[Mark]) -> TransportRequest:
        prefix, step, _ = split_key(tag)
        k = (peer, key_hash(prefix), step)
        req = _Recv("recv", peer, tag, buf.nbytes)
        req.buf = buf
        req.k = k
        req.mark = mark
        stashed = self._stash.get(k)
        if stashed:  # arrived before the receive (perhaps before the peer closed: still good)
            theirs, data = stashed.popleft()
            if not stashed:
                del self._stash[k]
            self.unexpected_taken(k[1])
            if mark is None or unmarked(req, mark, theirs or b"", data.nbytes, buf.nbytes):
                deliver("tcp", req, req.buf, data, self.traffic)
            return req
        p = self._peer(peer)
        if p.recv is None and p.data is not None and (peer, *p.k) == k and p.target is not None and (
                mark is None or (p.theirs == mark.blob and p.data.nbytes == buf.nbytes)):
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

    def stray(self, key: tuple, mark: Mark) -> Optional[Tuple[int, bytes, int]]:
        self.progress()
        khash = key_hash(key)
        for (peer, h, _), q in self._stash.items():
            for theirs, data in q:
                if h == khash and theirs != mark.blob:
                    return peer, theirs or b"", data.nbytes
        return None

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
                magic, version, khash, step, nbytes, theirs = _HEADER.unpack(p.header)
                if magic != _MAGIC or version & ~_MARKED != _VERSION or nbytes > _MAX_MESSAGE:
                    self._lost(p, f"sent a malformed header (magic {magic:#x}, version {version}, "
                                  f"{nbytes} B)")
                    return done
                if khash == _PING_HASH and not step and not nbytes:  # a ping: nothing to deliver
                    continue
                if khash == _NEWS_HASH and nbytes > _MAX_NEWS:
                    self._lost(p, f"sent {nbytes} B of news")
                    return done
                p.k = (khash, step)
                p.theirs = theirs if version & _MARKED else None
                queue = self._posted.get((p.rank, khash, step))
                recv = queue.popleft() if queue else None
                if queue is not None and not queue:
                    del self._posted[(p.rank, khash, step)]
                if recv is not None and recv.mark is not None and not unmarked(
                        recv, recv.mark, p.theirs or b"", nbytes, recv.buf.nbytes):
                    recv = None  # (failed: its payload goes to the stash)
                elif recv is not None and nbytes > recv.buf.nbytes:
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
            elif p.k[0] == _NEWS_HASH:  # (news: for whoever listens, never a receive's)
                if self.on_news is not None:
                    self.on_news(p.rank, bytes(p.data))  # type: ignore[arg-type]
            else:
                self._stash[(p.rank, *p.k)].append((p.theirs, p.data))
                self.unexpected_arrived(p.k[0])
            p.target, p.recv, p.data = None, None, None

    #: What takes a peer's news (``on_news(peer, payload)``), or None: drop it.
    on_news: Optional[Callable[[int, bytes], None]] = None

    def tell(self, payload: bytes) -> None:
        """Send every peer ``payload`` (at most 8 KiB) as news, ahead of whatever this rank sends
        them later (a close included): a peer's :attr:`on_news` gets it before it could see this
        rank leave (the team's news of a mismatch, :mod:`pycoll.news`)."""
        data = np.frombuffer(bytes(payload[:_MAX_NEWS]), np.uint8)
        for peer, p in self.peers.items():
            if p.error is None:
                self._send(data, peer, (_NEWS_HASH,), None, khash=_NEWS_HASH)
        self.flush(FLUSH_S)

    def flush(self, seconds: float) -> bool:
        """Write what waits to be sent, for up to ``seconds`` (a peer that reads nothing holds it
        back); whether all of it went."""
        deadline = time.monotonic() + seconds
        while self._sending:
            self.progress()
            if not self._sending or time.monotonic() > deadline:
                break
            time.sleep(0.0001)
        return not self._sending

    def _lost(self, p: _Peer, what: str) -> None:
        err: Exception = PeerLostError(f"tcp: lost rank {p.rank}: it {what}", rank=p.rank, how=what)
        said = self.gone().get(p.rank, "") if self.gone is not None else ""
        if OUT_OF_STEP_WORDS in said:  # (it left after it found the calls out of step: that error)
            why = said.split(OUT_OF_STEP_WORDS, 1)[1].strip()
            err = MismatchError(f"tcp: the ranks' calls went out of step: rank {p.rank} found that {why}")
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
        they closed the team), as far as the reads so far have seen, and those the team's look at
        its peers finds gone (see :class:`~pycoll.tl.base.Transport`)."""
        return {p.rank for p in self.peers.values() if p.error is not None} | super().lost_peers()

    closed = False

    def close(self) -> None:
        self.flush(FLUSH_S)  # (what this rank sent last, news included, reaches its peers before the end)
        self.closed = True
        for p in self.peers.values():
            try:
                self.selector.unregister(p.sock)
            except (KeyError, ValueError):
                pass
            p.sock.close()
        self.selector.close()


def hello(seal: Seal, rank: int, peer: int) -> bytes:
    """What rank ``rank`` says first on its connection to rank ``peer`` of the team of ``seal``."""
    return _HELLO.pack(_MAGIC, rank, seal.team_id, seal.mac("tcp-hello", rank, struct.pack("<I", peer)))


def read_hello(data: bytes, seal: Seal, rank: int, size: int) -> Optional[int]:
    """The rank that says the hello ``data`` to rank ``rank`` of the team of ``seal`` (of ``size``
    ranks), or None when it is no hello of such a rank: another team's, a stranger's (its MAC
    fails), a rank that should not connect here (only higher ranks connect to lower ones)."""
    if len(data) != _HELLO.size:
        return None
    magic, peer, team_id, tag = _HELLO.unpack(data)
    if magic != _MAGIC or team_id != seal.team_id or not rank < peer < size:
        return None
    if not hmac.compare_digest(tag, seal.mac("tcp-hello", peer, struct.pack("<I", rank))):
        return None
    return peer


def _address(value: bytes, r: int) -> Tuple[str, int]:
    """``(host, port)`` of rank ``r``'s listener from its ``host:port``."""
    host, _, port = value.decode(errors="replace").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TransportError(f"tcp: rank {r} advertised a malformed address {value[:64]!r}")
    return host, int(port)


def connect_mesh(rank: int, size: int, exchange: Any, seal: Seal, host: Optional[str] = None,
                 advertise: Optional[str] = None, timeout: float = 60.0) -> Dict[int, socket.socket]:
    """Connect every pair of ranks: rank j connects to every i < j, which accepts.

    ``exchange(value: bytes) -> list[bytes]`` allgathers the listening addresses (through the
    store: signed, see :func:`pycoll.auth.sealed`). The listener binds ``host`` (default: the
    address it advertises, ``advertise`` or 127.0.0.1). Every connection starts with a hello
    (:func:`hello`) checked on accept; connections that fail it are dropped, meanwhile the
    others' hellos are read (a stranger that connects and says nothing holds up no one).
    """
    addr = advertise or "127.0.0.1"
    bind = host if host is not None else addr
    try:
        listener = socket.create_server((bind, 0), family=socket.AF_INET6 if ":" in bind else socket.AF_INET,
                                        backlog=max(16, size))
    except OSError as exc:
        raise TransportError(f"tcp: rank {rank} cannot listen on {bind} (the address it advertises to its "
                             f"peers; pass advertise= an address of this host): {exc}") from None
    socks: Dict[int, socket.socket] = {}
    try:
        port = listener.getsockname()[1]
        addrs = [_address(a, r) for r, a in enumerate(exchange(f"{addr}:{port}".encode()))]
        deadline = time.monotonic() + timeout
        for i in range(rank):
            while True:
                try:
                    s = socket.create_connection(addrs[i], timeout=timeout)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TransportError(f"tcp: cannot connect to rank {i} at {addrs[i]}") from None
                    time.sleep(0.05)
            s.sendall(hello(seal, rank, i))
            socks[i] = s
        _accept_peers(listener, socks, seal, rank, size, deadline, timeout)
    except BaseException:
        for s in socks.values():
            s.close()
        raise
    finally:
        listener.close()
    return socks


def _accept_peers(listener: socket.socket, socks: Dict[int, socket.socket], seal: Seal, rank: int,
                  size: int, deadline: float, timeout: float) -> None:
    """Accept the higher ranks' connections into ``socks`` until every peer is there; read every
    pending connection's hello as it comes (each within :data:`HELLO_S`; the oldest pending ones
    make room when more than ``4 * size + 64`` wait)."""
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    pending: Dict[socket.socket, list] = {}  # connection -> [when its hello is due, what came of it]
    most = 4 * size + 64

    def drop(s: socket.socket, why: str) -> None:
        log.warning("pycoll: tcp: rank %d dropped a connection to its mesh listener: %s", rank, why)
        pending.pop(s, None)
        sel.unregister(s)
        s.close()

    try:
        while len(socks) < size - 1:
            now = time.monotonic()
            if now > deadline:
                missing = [r for r in range(rank + 1, size) if r not in socks]
                raise TransportError(f"tcp: rank {rank}: only {len(socks)} of {size - 1} peers connected "
                                     f"within {timeout:g} s (ranks {missing} did not)")
            for s, (due, _) in list(pending.items()):
                if now > due:
                    drop(s, f"it said no hello within {HELLO_S:g} s")
            wait = min([deadline, *(due for due, _ in pending.values())]) - now
            for key, _ in sel.select(max(0.0, wait)):
                if key.data is None:
                    try:
                        s, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    if len(pending) >= most:
                        drop(next(iter(pending)), f"more than {most} connections waited for their hellos")
                    s.setblocking(False)
                    pending[s] = [now + HELLO_S, b""]
                    sel.register(s, selectors.EVENT_READ, True)
                    continue
                s = key.fileobj  # type: ignore[assignment]
                entry = pending[s]
                try:
                    chunk = s.recv(_HELLO.size - len(entry[1]))
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    drop(s, f"it broke before its hello ({exc})")
                    continue
                if not chunk:
                    drop(s, "it closed before its hello")
                    continue
                entry[1] += chunk
                if len(entry[1]) < _HELLO.size:
                    continue
                peer = read_hello(entry[1], seal, rank, size)
                if peer is None or peer in socks:
                    drop(s, "its hello is no peer's of this team (a stranger's, another team's, or a "
                            "second one)" if peer is None else f"a second hello of rank {peer}")
                    continue
                pending.pop(s)
                sel.unregister(s)
                s.setblocking(True)
                socks[peer] = s
    finally:
        for s in list(pending):
            s.close()
        sel.close()
