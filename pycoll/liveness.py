"""Liveness: which peers of a team have left, and how, known without the transport.

One job: tell a rank which of its team's peers are gone, whatever carries the team's data (MPI's
and UCX's point to point notice a peer that left quietly only at the timeout). A team's bootstrap
makes a :class:`Liveness` (:meth:`Liveness.offer`: its part of the team's exchange, which signs it)
and connects it (:meth:`Liveness.meet`, collective); :mod:`pycoll.lost` decides what fails then.

How a rank knows that a peer left:

* a peer on its host (the same kernel and pid namespace): a pidfd of the peer's process, opened
  while the team is made and checked against the process's start time (a reused pid cannot pass
  for it), readable once the process has ended, a zombie nobody reaped included;
* a peer on another host (another network namespace), or one on this host whose process this
  rank cannot watch (another pid namespace, no pidfds): a connection (TCP between network
  namespaces, a Unix socket within one), which the peer's kernel closes when its process ends,
  whatever ended it. Its hello carries a MAC with the team's seal (:mod:`pycoll.auth`); one that
  does not is dropped. A team on one host makes none: pidfds only (cheap to make: no handshake);
* a peer that leaves while its process lives on (it returned from main and waits in
  ``MPI_Finalize``, raised an exception nobody caught, or closed the team) says so first, signed:
  how, how many untagged collectives it had posted, and the keys of those it left unfinished (at
  interpreter exit, in ``sys.excepthook``, and when the team closes). On its connection where
  there is one, else as a datagram to the peer's Unix datagram socket (one per rank and team, in
  the abstract namespace: bound before the team's exchange, nothing to connect);
* a host that stops answering: the TCP connections keep alive with ``TCP_USER_TIMEOUT`` at
  ``PYCOLL_PEER_SILENCE`` (at least 1 s), so such a peer is lost no sooner than by the transports'
  own rule. The kernel answers for a stopped process (SIGSTOP, a debugger): it is never lost.

Limits: a child forked by a rank holds the rank's connections open after the rank ends: on the
rank's host its pidfd still says it ended, across hosts only the silence rule does. A team dropped
without ``close()`` keeps its connections until its process ends (its engine holds its
transport), and then says it exited without saying what it had done: its peers take it as a rank
that ended without a word.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import secrets
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from pycoll import config, goodbyes
from pycoll.auth import Seal
from pycoll.errors import OUT_OF_STEP_WORDS, AuthError, TransportError
from pycoll.tl.base import key_hash

log = logging.getLogger("pycoll")

#: How a peer says it left (the ``how`` of its message).
EXITED, RAISED, CLOSED, OUT_OF_STEP = 1, 2, 3, 4
_SAYS = {EXITED: "exited", RAISED: "raised", CLOSED: "closed its team",
         OUT_OF_STEP: OUT_OF_STEP_WORDS}
#: The words of a peer that left after it found the team's calls out of step (its text follows).
OUT_OF_STEP_SAYS = _SAYS[OUT_OF_STEP]
#: The words of a peer that ended without a word, and of one whose host stopped answering.
DIED = "has died"
SILENT = "stopped answering: its host acknowledged nothing for {:.1f} s (gone, or cut off the network)"
#: Seconds the peers have to connect to each other while a team is made.
CONNECT_S = 30.0
#: The longest message a peer may send (it says how it left; more is a broken peer).
MAX_MESSAGE = 1 << 16
#: Keys of unfinished collectives a message lists at most, and characters of its reason.
MAX_KEYS, MAX_WHY = 256, 480
_VERSION = "2"  # (of the offer)
_HELLO = struct.Struct("<II16s")  # magic, rank, MAC
_MAGIC = 0x50434C56  # "PCLV"
_HEAD = struct.Struct("<BqH")  # how, untagged collectives posted, keys that follow
_KEY = struct.Struct("<BQQ")  # 0: untagged / 1: tagged, the key's hash, its number
_LEN = struct.Struct("<I")
_POLL_IN = select.POLLIN | select.POLLERR | select.POLLHUP


def wire_key(key: Optional[tuple]) -> Optional[Tuple[int, int, int]]:
    """A collective's message key as a message names it: ``(0, 0, k)`` for untagged collective
    ``k``, ``(1, hash of its tag, k)`` for the ``k``-th use of a tag; None for none."""
    if not key:
        return None
    if key[0] == "c" and len(key) >= 2:
        return (0, 0, int(key[1]))
    if key[0] == "u" and len(key) >= 3:
        return (1, key_hash(key[:2]), int(key[2]))
    return None


@dataclass
class Left:
    """How a peer left, as this rank learned it."""

    #: The words for it in an error: ``has died``, ``exited``, ``raised ValueError: ...``, ...
    how: str
    pid: int
    host: str
    #: Untagged collectives it had posted when it said it left (-1: it said nothing).
    posted: int = -1
    #: The keys (:func:`wire_key`) of the collectives it left unfinished.
    unfinished: FrozenSet[Tuple[int, int, int]] = frozenset()
    #: When this rank learned it (``time.monotonic()``).
    seen: float = field(default_factory=time.monotonic)

    @property
    def said(self) -> bool:
        """Whether it said how it left (else its process ended, or its host went silent)."""
        return self.posted >= 0

    def words(self, rank: int) -> str:
        return f"rank {rank} (pid {self.pid}, host {self.host}) {self.how}"


class _Peer:
    __slots__ = ("rank", "pid", "host", "pidfd", "sock", "inbox", "left")

    def __init__(self, rank: int, pid: int, host: str) -> None:
        self.rank, self.pid, self.host = rank, pid, host
        self.pidfd = -1
        self.sock: Optional[socket.socket] = None
        self.inbox = bytearray()
        self.left: Optional[Left] = None


_IDENTITY: Dict[int, Tuple[str, str, str, int, bool]] = {}  # this process's (by pid: a fork has its own)


def _identity() -> Tuple[str, str, str, int, bool]:
    """``(boot id, pid namespace, network namespace, start time, pidfds work)`` of this process
    ("" where unknown; read once): two processes share a host when the first two are equal, a
    network when the first and third are."""
    pid = os.getpid()
    if pid not in _IDENTITY:
        _IDENTITY.clear()
        _IDENTITY[pid] = _read_identity()
    return _IDENTITY[pid]


def _read_identity() -> Tuple[str, str, str, int, bool]:
    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return ""

    def ns(kind: str) -> str:
        try:
            st = os.stat(f"/proc/self/ns/{kind}")
        except OSError:
            return ""
        return f"{st.st_dev}.{st.st_ino}"

    try:
        os.close(os.pidfd_open(os.getpid()))
        pidfds = True
    except (OSError, AttributeError):
        pidfds = False
    return read("/proc/sys/kernel/random/boot_id"), ns("pid"), ns("net"), _start_time(os.getpid()), pidfds


def _start_time(pid: int) -> int:
    """When process ``pid`` started (clock ticks after boot; -1 where it is gone or unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rfind(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return -1


class Liveness:
    """One rank's watch over the other ranks of its team (see the module docstring)."""

    def __init__(self, rank: int, size: int, seal: Seal, address: Callable[[], str]) -> None:
        self.rank, self.size = rank, size
        self.peers: Dict[int, _Peer] = {}
        #: ``state() -> (untagged collectives posted, keys of those unfinished)``, said when this
        #: rank leaves (set by :mod:`pycoll.lost`; None: -1 and none).
        self.state: Optional[Callable[[], Tuple[int, List[tuple]]]] = None
        #: ``out_of_step() -> str``: why the team's calls went out of step on this rank ("": they
        #: did not); a rank that leaves then says that instead of how (set by :mod:`pycoll.lost`).
        self.out_of_step: Optional[Callable[[], str]] = None
        self._seal = seal
        self._address = address  # (where this rank listens for peers on other hosts)
        self._poll = select.poll()
        #: fd -> (peer, is its pidfd); peer None: the datagram socket
        self._fds: Dict[int, Tuple[Optional[_Peer], bool]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()  # (a forked child never speaks for this rank)
        self._closed = False
        self._boot, self._pidns, self._netns, self._start, self._pidfds = _identity()
        self._name = f"\0pycoll-live-{secrets.token_hex(8)}"  # (+ "s": its listener, + "d": its datagrams)
        self._listener: Optional[socket.socket] = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._name + "s")  # (for the peers here that cannot watch this process)
        self._listener.listen(max(16, size))
        self._dgram: Optional[socket.socket] = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._dgram.bind(self._name + "d")
        self._dgram.setblocking(False)
        self._addrs: Dict[int, str] = {}  # peer -> its datagram socket's name (those on this network)
        self._unchecked: List[Tuple[_Peer, int]] = []  # (peer, its start time): pidfds not yet checked

    # ------------------------------------------------------------------ being made
    def offer(self) -> bytes:
        """This rank's part of the team's bootstrap exchange (which signs it)."""
        host = socket.gethostname().replace(",", "_")
        return ",".join((_VERSION, self._boot, self._pidns + "/" + str(int(self._pidfds)), self._netns,
                         str(os.getpid()), str(self._start), self._name[1:], host)).encode()

    def meet(self, offers: Sequence[bytes], exchange: Callable[[bytes], List[bytes]]) -> None:
        """Watch the peers whose ``offers`` the team's exchange brought (collective: every rank
        calls it with the same): open pidfds of those on this host, connect to those on other
        networks and those whose process either cannot watch (the others say how they left as
        datagrams). Where the team spans network namespaces, two more rounds of ``exchange``: the
        TCP addresses (this rank listens on ``address()``), then whom each rank reached. A peer
        that cannot be reached is watched without a connection, and said so."""
        parsed = [o.decode(errors="replace").split(",", 7) for o in offers]
        if len(parsed) != self.size or any(len(p) != 8 or p[0] != _VERSION for p in parsed):
            raise TransportError(f"liveness: rank {self.rank}: a peer's offer is not one this version reads")
        nets = [(p[1], p[3]) for p in parsed]
        me = (parsed[self.rank][1], parsed[self.rank][2])  # (on this host, and both open pidfds)
        watched = [bool(p[1]) and p[2].endswith("/1") and len(p[2]) > 2 and (p[1], p[2]) == me
                   for p in parsed]
        # a connection between two ranks where either cannot watch the other's process, or they
        # are on two networks (the same on both sides: both decide it from the same offers)
        linked = {r for r in range(self.size) if r != self.rank
                  and (not watched[r] or nets[r] != nets[self.rank] or not nets[r][0])}
        for r, (_, _boot, _pidns, _net, pid, start, name, host) in enumerate(parsed):
            if r != self.rank:
                peer = self.peers[r] = _Peer(r, int(pid), host)
                if watched[r]:
                    self._open_pidfd(peer, int(start))
                if r not in linked:
                    self._addrs[r] = "\0" + name + "d"
        tcp: List[str] = [""] * self.size
        listener = None
        try:
            multi = len(set(nets)) > 1 or any(not b or not n for b, n in nets)  # several networks: TCP too
            if multi:
                mine = b""
                if any(nets[r] != nets[self.rank] or not nets[r][0] for r in self.peers):
                    listener, mine = _tcp_listener(self._address(), self.size)
                tcp = [v.decode(errors="replace") for v in exchange(mine)]
            reached = self._connect(parsed, nets, tcp, linked) if linked else set()
            coming = {r for r in range(self.rank + 1, self.size) if r in linked}
            if multi:  # (a connection between hosts can fail: wait only for those that were made)
                says = [v.decode(errors="replace").split(",") for v in exchange(
                    ",".join(map(str, sorted(reached))).encode())]
                coming = {r for r in coming if str(self.rank) in says[r]}
            if coming:
                self._accept(listener, coming)
        finally:
            for lst in (listener, self._listener):
                if lst is not None:
                    lst.close()
            self._listener = None
        for peer in self.peers.values():
            if peer.sock is not None:
                peer.sock.setblocking(False)
                self._register(peer.sock.fileno(), peer, False)
        assert self._dgram is not None
        self._register(self._dgram.fileno(), None, False)
        goodbyes.watch(self, EXITED, RAISED)

    def _open_pidfd(self, peer: _Peer, start: int) -> None:
        """Watch ``peer``'s process (started at ``start``) with a pidfd; whether the pid is still
        that process is checked at the first look (off the bootstrap: a /proc read a peer)."""
        try:
            fd = os.pidfd_open(peer.pid)
        except ProcessLookupError:
            peer.left = Left(DIED, peer.pid, peer.host)
            return
        except (OSError, AttributeError):  # (no pidfds here: the transport alone tells)
            log.warning("pycoll: liveness: rank %d cannot watch rank %d's process (pid %d)", self.rank,
                        peer.rank, peer.pid)
            return
        peer.pidfd = fd
        self._unchecked.append((peer, start))
        self._register(fd, peer, True)

    def _check_starts(self) -> None:
        """Whether each pid opened is still the peer's process (a pid reused by another process
        between the peer's offer and its pidfd: the peer ended)."""
        for peer, start in self._unchecked:
            if peer.pidfd >= 0 and _start_time(peer.pid) != start and peer.left is None:
                self._drop(peer.pidfd)
                peer.left = Left(DIED, peer.pid, peer.host)
        self._unchecked.clear()

    def _register(self, fd: int, peer: Optional[_Peer], pidfd: bool) -> None:
        self._fds[fd] = (peer, pidfd)
        self._poll.register(fd, _POLL_IN)

    def _connect(self, parsed: List[List[str]], nets: List[Tuple[str, str]], tcp: List[str],
                 linked: Set[int]) -> Set[int]:
        """Connect to every lower rank of ``linked`` and say hello (they accept: :meth:`_accept`);
        the ranks reached."""
        reached: Set[int] = set()
        deadline = time.monotonic() + CONNECT_S
        for r in sorted(x for x in linked if x < self.rank):
            peer = self.peers[r]
            local = nets[r] == nets[self.rank] and nets[r][0] != ""
            sock = None
            try:
                if local:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.settimeout(max(0.1, deadline - time.monotonic()))
                    sock.connect("\0" + parsed[r][6] + "s")
                elif tcp[r]:
                    host, port = tcp[r].rsplit(":", 1)
                    sock = socket.create_connection((host.strip("[]"), int(port)),
                                                    timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                    _keep_alive(sock)
                else:
                    raise OSError("it listens on no address")
                sock.sendall(_HELLO.pack(_MAGIC, self.rank, self._hello_mac(self.rank, r)))
                peer.sock = sock
                reached.add(r)
            except OSError as exc:
                if sock is not None:
                    sock.close()
                log.warning("pycoll: liveness: rank %d cannot connect to rank %d (%s): only its process's "
                            "end on this host, or the transport, will tell that it left", self.rank, r, exc)
        return reached

    def _accept(self, tcp_listener: Optional[socket.socket], waiting: Set[int]) -> None:
        """Take the connections of the higher ranks ``waiting`` (each with its hello, checked)
        until every one did, or :data:`CONNECT_S` passed; drop anything else."""
        listeners = [x for x in (self._listener, tcp_listener) if x is not None]
        pending: Dict[socket.socket, float] = {}
        deadline = time.monotonic() + CONNECT_S
        for lst in listeners:
            lst.setblocking(False)
        while waiting:
            now = time.monotonic()
            if now > deadline:
                log.warning("pycoll: liveness: rank %d: ranks %s did not connect within %g s", self.rank,
                            sorted(waiting), CONNECT_S)
                break
            ready, _, _ = select.select(listeners + list(pending), [], [], min(1.0, deadline - now))
            for s in ready:
                if s in listeners:
                    try:
                        conn, _ = s.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    conn.setblocking(False)
                    pending[conn] = now + 10.0
                    continue
                peer = self._hello_of(s, waiting)
                if peer is None and s.fileno() < 0:  # (refused: closed)
                    del pending[s]
                elif peer is not None:
                    del pending[s]
                    waiting.discard(peer)
                    s.setblocking(True)
                    if s.family != socket.AF_UNIX:
                        _keep_alive(s)
                    self.peers[peer].sock = s
            for s, due in list(pending.items()):
                if s.fileno() < 0 or time.monotonic() > due:
                    pending.pop(s)
                    s.close()
        for s in pending:
            s.close()

    def _hello_of(self, s: socket.socket, waiting: Set[int]) -> Optional[int]:
        """The rank whose hello ``s`` says (None: not all of it yet, or not a peer's: closed)."""
        try:
            data = s.recv(_HELLO.size, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            data = b""
        if len(data) < _HELLO.size and data:
            return None
        if len(data) == _HELLO.size:
            s.recv(_HELLO.size)
            magic, peer, mac = _HELLO.unpack(data)
            if magic == _MAGIC and peer in waiting and \
                    secrets.compare_digest(mac, self._hello_mac(peer, self.rank)):
                return peer
        log.warning("pycoll: liveness: rank %d dropped a connection that said no hello of its team",
                    self.rank)
        s.close()
        return None

    def _hello_mac(self, rank: int, to: int) -> bytes:
        return self._seal.mac("live-hello", rank, struct.pack("<I", to))

    # ------------------------------------------------------------------ watching
    def look(self) -> Dict[int, Left]:
        """The peers known to have left (a new dict), looking now at what their pidfds and
        connections say."""
        with self._lock:
            if self._unchecked and not self._closed:
                self._check_starts()
            if not self._closed and self._fds:
                for fd, _ in self._poll.poll(0):
                    entry = self._fds.get(fd)
                    if entry is not None:
                        self._read(fd, *entry)
            return {r: p.left for r, p in self.peers.items() if p.left is not None}

    def gone(self) -> Dict[int, str]:
        """The ranks known to have left for good (every kind of leaving is for good here), each
        with the words for it (``rank 2 (pid 4242, host n1) has died``)."""
        return {r: left.words(r) for r, left in self.look().items()}

    def _read(self, fd: int, peer: Optional[_Peer], pidfd: bool) -> None:
        if peer is None:
            return self._datagrams()
        if pidfd:
            self._drop(fd)
            if peer.left is None:
                peer.left = Left(DIED, peer.pid, peer.host)
            return
        sock = peer.sock
        assert sock is not None
        why = ""
        while True:
            try:
                chunk = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return self._parse(peer)
            except OSError as exc:  # (ETIMEDOUT: its host left the keepalives unanswered)
                chunk, why = b"", SILENT.format(_silence()) if exc.errno == errno.ETIMEDOUT else ""
            if not chunk:
                self._parse(peer)
                self._drop(fd)
                if peer.left is None:
                    how = why if why.startswith("stopped") else DIED
                    peer.left = Left(how, peer.pid, peer.host)
                return
            peer.inbox += chunk
            if len(peer.inbox) > MAX_MESSAGE + _LEN.size:
                log.warning("pycoll: liveness: rank %d sent more than a message; not read further", peer.rank)
                self._drop(fd)
                return

    def _datagrams(self) -> None:
        """Take the messages that came as datagrams (from peers on this network without a
        connection: each signed, and naming its writer)."""
        assert self._dgram is not None
        while True:
            try:
                blob = self._dgram.recv(MAX_MESSAGE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                writer, said = self._seal.verify(f"live-left>{self.rank}", blob, self.size)
                peer = self.peers.get(writer)
                if peer is None or writer not in self._addrs:
                    raise ValueError(f"rank {writer} has a connection: it says nothing here")
                left = _decode(said, peer)
            except (AuthError, ValueError, struct.error) as exc:
                log.warning("pycoll: liveness: a datagram was refused: %s", exc)
                continue
            if peer.left is None or not peer.left.said:
                peer.left = left

    def _parse(self, peer: _Peer) -> None:
        """Take the whole messages in ``peer``'s inbox (each: how it left, signed)."""
        box = peer.inbox
        while len(box) >= _LEN.size:
            (n,) = _LEN.unpack_from(box)
            if n > MAX_MESSAGE or len(box) < _LEN.size + n:
                return
            blob = bytes(box[_LEN.size:_LEN.size + n])
            del box[:_LEN.size + n]
            try:
                _, said = self._seal.verify(f"live-left>{self.rank}", blob, self.size, rank=peer.rank)
                left = _decode(said, peer)
            except (AuthError, ValueError, struct.error) as exc:
                log.warning("pycoll: liveness: rank %d's message was refused: %s", peer.rank, exc)
                continue
            if peer.left is None or not peer.left.said:
                peer.left = left

    def _drop(self, fd: int) -> None:
        entry = self._fds.pop(fd, None)
        if entry is None:
            return
        self._poll.unregister(fd)
        peer, pidfd = entry
        if peer is None:  # (the datagram socket: closed in _close)
            return
        if pidfd:
            os.close(fd)
            peer.pidfd = -1
        elif peer.sock is not None:
            peer.sock.close()
            peer.sock = None

    # ------------------------------------------------------------------ leaving
    def leave(self, how: int, why: str = "") -> None:
        """Tell every peer that this rank leaves the team (``how``: EXITED, RAISED or CLOSED;
        ``why``: the exception's text), with what :attr:`state` says, and stop watching (once;
        never from a forked child)."""
        if os.getpid() != self._pid or self._closed:
            return
        posted, keys = -1, []
        if self.state is not None:  # (before the lock: the state takes the engine's)
            try:
                posted, keys = self.state()
                mismatch = self.out_of_step() if self.out_of_step is not None else ""
                if mismatch:  # (its peers are to raise the mismatch, not a lost peer)
                    how, why = OUT_OF_STEP, mismatch
            except Exception:  # noqa: BLE001 - what it said must not stop the goodbye
                log.debug("pycoll: liveness: the team's state could not be read", exc_info=True)
        with self._lock:
            if self._closed:
                return
            wired = [k for k in (wire_key(key) for key in keys) if k is not None][:MAX_KEYS]
            payload = _HEAD.pack(how, posted, len(wired)) + b"".join(_KEY.pack(*k) for k in wired) + \
                why.encode(errors="replace")[:MAX_WHY]
            for peer in self.peers.values():
                if peer.left is not None:
                    continue
                blob = self._seal.sign(f"live-left>{peer.rank}", self.rank, payload)
                try:  # (small: the socket's buffer takes it)
                    if peer.sock is not None:
                        peer.sock.send(_LEN.pack(len(blob)) + blob)
                    elif peer.rank in self._addrs and self._dgram is not None:
                        self._dgram.sendto(blob, self._addrs[peer.rank])
                except OSError:  # (gone already, or its socket full: its process's end tells)
                    pass
            self._close()

    def close(self) -> None:
        """Stop watching and close every pidfd and connection (without a word: see :meth:`leave`)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        self._closed = True
        for fd in list(self._fds):
            self._drop(fd)
        for peer in self.peers.values():
            if peer.sock is not None:
                peer.sock.close()
                peer.sock = None
        for lst in (self._listener, self._dgram):
            if lst is not None:
                lst.close()
        self._listener = self._dgram = None
        goodbyes.unwatch(self)


def _decode(said: bytes, peer: _Peer) -> Left:
    how, posted, n = _HEAD.unpack_from(said)
    end = _HEAD.size + n * _KEY.size
    if how not in _SAYS or n > MAX_KEYS or len(said) < end or posted < -1:
        raise ValueError("a message of no known form")
    keys = frozenset(_KEY.unpack_from(said, _HEAD.size + i * _KEY.size) for i in range(n))
    why = said[end:end + MAX_WHY].decode(errors="replace")
    words = _SAYS[how] + (f" {why}" if why else "")
    return Left(words, peer.pid, peer.host, posted=posted, unfinished=keys)


def _silence() -> float:
    silence = config.get("PYCOLL_PEER_SILENCE")
    return max(1.0, silence) if silence < math.inf else math.inf


def _keep_alive(sock: socket.socket) -> None:
    """Lose the connection when the peer's host acknowledges nothing for PYCOLL_PEER_SILENCE."""
    silence = _silence()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if silence == math.inf:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(silence / 2)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, int(silence / 4)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(silence * 1000))
    except (OSError, AttributeError):
        pass


def _tcp_listener(address: str, size: int) -> Tuple[Optional[socket.socket], bytes]:
    """A TCP listener on ``address`` (this rank's, as its peers reach it) and its address (None
    and nothing where it cannot listen there: said so)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        listener = socket.create_server((address, 0), family=family, backlog=max(16, size))
    except OSError as exc:
        log.warning("pycoll: liveness: cannot listen on %s (the address the team's peers on other hosts "
                    "use to reach this rank): %s", address, exc)
        return None, b""
    port = listener.getsockname()[1]
    host = f"[{address}]" if family == socket.AF_INET6 else address
    return listener, f"{host}:{port}".encode()


def host_address() -> str:
    """The address of this host on its default route (for a team made from MPI that spans
    hosts), else that of its name, else 127.0.0.1."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # (no packet is sent: the kernel picks the route)
            return probe.getsockname()[0]
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


__all__ = ["CLOSED", "DIED", "EXITED", "Left", "Liveness", "RAISED", "host_address", "wire_key"]
