"""UCX transport: UCP tag messaging over one worker per pycoll Context, shared by its teams.

Every pycoll Context (process) gets one UCP context and worker, made by its first UCX team and
released by its last (refcounted; :func:`context_worker` finds it). Each team exchanges
worker addresses with its bootstrap ``allgather`` and opens one endpoint per rank (itself
included). The UCX library is found at run time (see :mod:`pycoll.tl.ucx.loader`).

Message keys become 64-bit UCP tags::

    bit  63      0: untagged collective   1: checked key (user tag, partition, point to point)
    bits 51-62   team id (12 bits), agreed in the bootstrap: the lowest id free on every member
    bit  50      untagged: the message is of the collective's agreement check (key ``("c", seq,
                 "agree")``: its exchange of fingerprints), not of the collective itself
    bits 32-49   source rank (18 bits)
    bits 12-31   untagged: sequence number mod 2**20; checked: 20 bits of the 64-bit key hash
    bits  0-11   step mod 2**12

UCP matches tags worker-wide, so the source rank and the team id are in every tag: teams sharing
the worker never match each other's messages and a receive from rank p never takes rank q's.
Untagged collectives ``("c", seq, step)`` have sequence numbers unique among those in flight, so
their tags are exact: they are plain ``ucp_tag_recv_nbx`` into the caller's buffer (the fast path);
so are their agreement checks' (whose tags a native program's check, ``native/exec_ucx.c``, makes
alike).
Checked keys (anything else) can collide in 20 bits, so each such message carries a 24-byte header
(full key hash, step, magic) in front of its payload, sent as one two-part (IOV) message. Their
receives are not posted to UCP: while any wait, ``progress`` takes the team's checked messages with
``ucp_tag_probe_nb(remove)`` and receives each (header into a small buffer, payload straight into
the buffer of the first waiting receive on that tag when it fits, else into a temporary); the
header then names the key, and a message that was not that receive's (a 20-bit collision) is
copied to the receive it names or kept until that receive is posted.

Unexpected messages and the credit gate: :meth:`poll_unexpected` (asked by the engine when work is
held back for lack of credit) takes every message of the team that arrived without a posted
receive into a stash, so a peer's rendezvous sends complete (the transport contract), counting
each under its demand id (``("slot", seq mod 2**20)`` for untagged, the key hash for checked) so
``has_unexpected`` is O(1). Receives look in the stash first, so order per (peer, key) is kept.

Marks (see :mod:`pycoll.tl.marks`): a marked untagged message is sent as two parts (IOV), the
mark then the payload, and received the same way (``pc_ucx_recv2``), so the native executor's
marked messages (``native/exec_ucx.c``) and Python's are the same on the wire; a checked key's
header carries the mark instead (and says whether there is one).

A message larger than the receive posted for it fails that receive with a TransportError: UCP's
``UCS_ERR_MESSAGE_TRUNCATED`` for direct receives (UCP never writes past the buffer), the
announced length for checked ones. Endpoints to ranks on other nodes use UCP's peer error mode: a
transport error on such an endpoint fails every operation with that rank, naming it. Endpoints
within a node do not (``PYCOLL_UCX_PEER_ERRORS``, default ``auto``; ``1``: all, ``0``: none),
because that mode rules out UCX's shared-memory transports (sysv, posix: "no peer failure
handler"), leaving TCP (measured: 20 us and 0.5 GB/s instead of a few us and GB/s); a rank that
dies on the same node is then noticed by the collective's timeout (a pycoll TimeoutError).

Shutdown (``close``, collective over the team): cancel what is still posted, a UCX-level barrier
(every rank sends a zero-byte "bye" to every other and waits for theirs, so all of a team's traffic
has arrived), a bootstrap barrier so no peer still talks to us, then close the endpoints (forced:
nothing is in flight any more, and a flushing close in UCP's peer error mode is a handshake that
needs the peer's worker progressing, which a peer blocked in the bootstrap barrier does not do),
discard the team's leftover unexpected messages (its id may be reused) and release the team id;
the last team destroys the worker and the UCP context. If a peer failed (or its "bye" does not
come within 10 s) the bootstrap barrier is skipped.

Traffic (``transport.traffic``, payload bytes, not the 24-byte headers of checked keys, nor the close
barrier's "bye" messages): a send counts when it is handed to UCP (``isend`` and the channel's fast
``isend``), a receive when it completes: receives posted to UCP in
:meth:`UCXTransport.complete_request` (with the length UCP reports), checked ones filled in place in
:meth:`UCXTransport._landed`, and stashed messages when ``deliver`` copies them in.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import struct
import tempfile
import time
import weakref
from collections import defaultdict, deque
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import numpy as np

from pycoll import config
from pycoll.errors import PeerLostError, TransportError
from pycoll.tl.base import Channel, Transport, TransportRequest, deliver, key_hash, split_key
from pycoll.tl.limit import limit_sends
from pycoll.tl.marks import MARK_BYTES, Mark, unmarked
from pycoll.tl.ucx import loader

_CHECKED = 1 << 63
_TEAM_SHIFT, _TEAM_BITS = 51, 12
_SRC_SHIFT, _SRC_BITS = 32, 18
#: The bit above the source field: a message of an untagged collective's agreement check (its
#: exchange of fingerprints, key ``("c", seq, "agree")``), on the same tags as the collective's
#: own but for this bit (so that the native executor and Python post them alike).
_AGREE = 1 << (_SRC_SHIFT + _SRC_BITS)
_KEY_SHIFT, _KEY_BITS = 12, 20
_KEY_MASK = (1 << _KEY_BITS) - 1
_STEP_MASK = (1 << 12) - 1
_log = logging.getLogger("pycoll")
_SRC_MASK = (1 << _SRC_BITS) - 1
_FULL = (1 << 64) - 1
_TEAM_FIELD = ((1 << _TEAM_BITS) - 1) << _TEAM_SHIFT
_LOW = (1 << _SRC_SHIFT) - 1  # key and step bits
_BYE = _CHECKED | _LOW  # key and step bits all ones, zero bytes: the close barrier's message
_PING = _CHECKED | (_LOW - 1)  # zero bytes: a ping (see check_silence), dropped where it arrives
_HEADER = struct.Struct("<QQII32s")  # key hash, step, magic, version (| _MARKED: with a mark), mark
_MAGIC = 0x50435558  # "PCUX"
_VERSION = 1
_MARKED = 1 << 16
_NO_MARK = bytes(MARK_BYTES)
_BOOT = struct.Struct("<IIIII")  # magic, version, team size, address bytes, node name bytes
_MAX_TEAMS = 1 << _TEAM_BITS
_U8 = np.uint8

_ffi: Any = None
_lib: Any = None
_OK = 0
_INPROGRESS = 1
_TRUNCATED = -9
_CANCELED = -16


def _node() -> bytes:
    """This process's node name (PYCOLL_NODE_ID, else the hostname)."""
    return (config.get("PYCOLL_NODE_ID") or socket.gethostname()).encode()[:255]


def _peer_modes(nodes: List[bytes], mine: bytes) -> List[int]:
    """Whether each rank's endpoint uses UCP's peer error mode (PYCOLL_UCX_PEER_ERRORS: ``auto``,
    the default: for ranks on other nodes only, as the mode rules out UCX's shared-memory
    transports, which cannot report a peer's failure; ``1``: every rank; ``0``: none)."""
    mode = os.environ.get("PYCOLL_UCX_PEER_ERRORS", "auto").strip().lower()
    if mode in ("1", "yes", "true", "on"):
        return [1] * len(nodes)
    if mode in ("0", "no", "false", "off"):
        return [0] * len(nodes)
    return [int(n != mine) for n in nodes]


def _status(st: int) -> str:
    return _ffi.string(_lib.pc_ucx_status_string(st)).decode(errors="replace")


def _silence() -> float:
    """PYCOLL_PEER_SILENCE as the TCP transport reads it (at least 1 s; inf: never)."""
    silence = config.get("PYCOLL_PEER_SILENCE")
    return max(1.0, silence) if silence < math.inf else math.inf


def _tcp_settings() -> bytes:
    """UCX's TCP settings (applied where the environment does not set them): the kernel's
    keepalive probes an idle connection after a second. No ``TCP_USER_TIMEOUT``: the kernel
    applies it to a receiver whose window stays full too, so a peer merely stopped (SIGSTOP, a
    debugger) while data waited for it was lost; a host that goes silent is lost by the team's
    look at its peers (:mod:`pycoll.liveness`: a connection of its own that carries no data, whose
    probes a stopped process's kernel answers)."""
    if _silence() == math.inf:
        return b""
    return b"TCP_KEEPIDLE=1s\nTCP_KEEPINTVL=1s"


def _finished(req: TransportRequest) -> bool:
    """Whether ``req`` finished, well or not (a ping's send: nobody waits on it)."""
    try:
        return req.test()
    except TransportError:
        return True


class _Worker:
    """The UCP context and worker of one pycoll Context, shared by its UCX teams."""

    def __init__(self) -> None:
        global _ffi, _lib, _OK, _INPROGRESS, _TRUNCATED, _CANCELED
        _ffi, _lib = loader.load()
        _OK, _INPROGRESS = _lib.UCS_OK, _lib.UCS_INPROGRESS
        _TRUNCATED, _CANCELED = _lib.UCS_ERR_MESSAGE_TRUNCATED, _lib.UCS_ERR_CANCELED
        major, minor = loader.api_version()
        ctxp = _ffi.new("ucp_context_h *")
        wp = _ffi.new("ucp_worker_h *")
        st = _lib.pc_ucx_init(major, minor, _tcp_settings(), ctxp, wp)
        if st != _OK:
            raise TransportError(f"ucx: cannot create a UCP context and worker: {_status(st)}")
        self.context, self.worker = ctxp[0], wp[0]
        buf = _ffi.new("char[]", 1 << 16)
        n = _ffi.new("size_t *")
        st = _lib.pc_ucx_address(self.worker, buf, 1 << 16, n)
        if st != _OK:
            self.destroy()
            raise TransportError(f"ucx: cannot get the worker's address: {_status(st)}")
        self.address = bytes(_ffi.buffer(buf, n[0]))
        self.refs = 0
        self.team_ids: set = set()
        #: Endpoints of closed teams (with what their error callbacks write to), closed with the
        #: worker: UCX's TCP transport carries every endpoint between two workers on one
        #: connection, so force-closing a team's endpoints reset the others' ("error during flush:
        #: Connection reset by remote peer" in the next team's close, 8 ranks as 3 nodes).
        self.retired: List[tuple] = []

    def used_bitmap(self) -> bytes:
        bits = 0
        for t in self.team_ids:
            bits |= 1 << t
        return bits.to_bytes(_MAX_TEAMS // 8, "little")

    def destroy(self) -> None:
        if self.retired and self.worker is not None:
            st = _ffi.new("int *")
            info = _ffi.new("ucp_tag_recv_info_t *")
            reqs = []
            for eps, _flags, _addrs in self.retired:
                for ep in eps:
                    ucp = _lib.pc_ucx_ep_close(ep, 1, st)
                    if st[0] == _INPROGRESS:
                        reqs.append(ucp)
            self.retired = []
            deadline = time.monotonic() + 5.0
            while reqs and time.monotonic() < deadline:
                reqs = [q for q in reqs if _lib.pc_ucx_test(q, 0, info) == _INPROGRESS]
                if not _lib.pc_ucx_progress(self.worker, 16):
                    time.sleep(0.0002)
        if self.worker is not None or self.context is not None:
            _lib.pc_ucx_fini(self.context or _ffi.NULL, self.worker or _ffi.NULL)
            self.worker = self.context = None


def info_text() -> str:
    """UCX's own description of a fresh UCP context and worker (``ucp_context_print_info`` and
    ``ucp_worker_print_info``), for :func:`pycoll.tl.ucx.info`."""
    w = _Worker()
    try:
        fd, path = tempfile.mkstemp(prefix="pycoll-ucx-info-")
        os.close(fd)
        try:
            _lib.pc_ucx_print_info(w.context, w.worker, path.encode())
            with open(path, errors="replace") as f:
                return f.read()
        finally:
            os.unlink(path)
    finally:
        w.destroy()


#: The worker of each pycoll Context that has UCX teams open (an entry goes with its last team).
_WORKERS: weakref.WeakKeyDictionary[Any, _Worker] = weakref.WeakKeyDictionary()


def context_worker(ctx: Any) -> Any:
    """The UCP worker (``ucp_worker_h``) the UCX teams of pycoll Context ``ctx`` share, the
    ``worker`` of each of their transports; None while ``ctx`` has no UCX team open."""
    w = _WORKERS.get(ctx)
    return None if w is None else w.worker


def _acquire(ctx: Any) -> _Worker:
    w = _WORKERS.get(ctx)
    if w is None or w.worker is None:
        w = _WORKERS[ctx] = _Worker()
    w.refs += 1
    return w


def _release(ctx: Any, w: _Worker) -> None:
    w.refs -= 1
    if w.refs <= 0:
        w.destroy()
        if _WORKERS.get(ctx) is w:
            del _WORKERS[ctx]


class _Req(TransportRequest):
    """A send, or a receive posted to UCP (untagged), or one waiting for a stashed message
    (``mark``: the mark a marked receive compares, ``hdr`` where its message's landed)."""

    __slots__ = ("ucp", "transport", "buf", "keep", "info", "mark", "hdr")

    def test(self) -> bool:
        if self.error is not None:  # (first: a receive may be done with an error, see unmarked)
            raise self.error
        if self.done:
            return True
        ucp = self.ucp
        if ucp is None:
            return False
        recv = self.kind == "recv"
        st = _lib.pc_ucx_test(ucp, recv, self.info if recv else _ffi.NULL)
        if st == _INPROGRESS:
            return False
        self.ucp = None
        self.transport.complete_request(self, st)
        if self.error is not None:
            raise self.error
        return self.done

    def cancel(self) -> None:
        if not self.done and self.ucp is not None and self.kind == "recv":
            _lib.pc_ucx_cancel(self.transport.worker, self.ucp)


class _CRecv(TransportRequest):
    """A receive of a checked key: filled by the transport's progress (see the module doc)."""

    __slots__ = ("buf", "k", "wire", "busy", "canceled", "transport", "mark")

    def cancel(self) -> None:
        if not self.done and not self.canceled:
            self.canceled = True
            if not self.busy:
                self.transport.unwait(self)


class _Pull:
    """A probed message being received (into a waiting receive's buffer or a temporary)."""

    __slots__ = ("ucp", "wire", "hdr", "data", "target", "info", "iov", "nbytes", "waiter")

    def __init__(self, wire: int) -> None:
        self.wire = wire
        self.ucp = None
        self.hdr = None
        self.data = None
        self.target = None
        self.waiter = None  # an untagged receive that took this stash entry before it completed
        self.info = _ffi.new("ucp_tag_recv_info_t *")
        self.iov = None
        self.nbytes = 0


class UCXChannel(Channel):
    """A channel whose untagged messages skip key parsing: the tag base is computed once.

    ``stash`` is the transport's store of untagged messages that arrived before their receive: the
    fast receive is taken only while it is empty (a stashed message must match first)."""

    __slots__ = ("fast", "base", "stash")

    def __init__(self, transport: UCXTransport, key: tuple, stash: Dict[int, deque]) -> None:
        super().__init__(transport, key)
        self.stash = stash
        self.rekey(key)

    def rekey(self, key: tuple) -> None:
        self.key = key
        self.fast = key[0] == "c" and (len(key) == 2 or (len(key) == 3 and key[2] == "agree"))
        self.base = self.transport.untagged_base(key) if self.fast else 0

    def isend(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        if not self.fast:
            return super().isend(buf, peer, step)
        t = self.transport
        req = t.send_wire(buf, peer, self.base | (t.rank << _SRC_SHIFT) | (step & _STEP_MASK), step, None,
                          self.mark)
        t.traffic.sent(peer, buf.nbytes)
        return req

    def irecv(self, buf: np.ndarray, peer: int, step: int) -> TransportRequest:
        t = self.transport
        if not self.fast or self.stash:
            return super().irecv(buf, peer, step)
        return t.recv_wire(buf, peer, self.base | (peer << _SRC_SHIFT) | (step & _STEP_MASK), step, self.mark)


class UCXTransport(Transport):
    """Point-to-point over UCX (UCP tag API) among the ranks of one team.

    ``allgather(bytes) -> list[bytes]`` is the team's blocking bootstrap exchange (MPI or a store);
    ``barrier(poll)``, where given, a barrier of that bootstrap which calls ``poll()`` while it
    waits (the close ends with one); ``ctx`` the pycoll Context whose worker the team shares.
    """

    name = "ucx"

    def __init__(self, rank: int, size: int, allgather: Callable[[bytes], List[bytes]], ctx: Any,
                 barrier: Optional[Callable[[Callable[[], int]], None]] = None) -> None:
        if size > _SRC_MASK + 1:
            raise TransportError(f"ucx: teams of at most {_SRC_MASK + 1} ranks (tags carry 18 bits of "
                                 f"rank), got {size}")
        self.rank, self.size, self.ctx, self._allgather = rank, size, ctx, allgather
        self._barrier = barrier
        self._closed = True
        self._w = _acquire(ctx)
        try:
            self._bootstrap()
        except BaseException:
            _release(ctx, self._w)
            raise
        self._closed = False
        #: Whether PYCOLL_BW_LIMIT paces this transport's sends (then programs run in Python).
        self.limited = limit_sends(self) is not None
        self._programs: Dict[int, Any] = {}  # id(program) -> (program, its NativeProgram)
        self._eps_array: Any = None
        self._native = 0  # native programs running (their receives are UCP's, not the stash's)
        self._held: List[Tuple[Any, Callable[[], bool]]] = []  # given-up tasks UCX still uses

    def _bootstrap(self) -> None:
        w = self._w
        self.worker = w.worker
        node = _node()
        mine = _BOOT.pack(_MAGIC, _VERSION, self.size, len(w.address), len(node)) + w.used_bitmap() + \
            w.address + node
        parts = self._allgather(mine)
        if len(parts) != self.size:
            raise TransportError(f"ucx: bootstrap exchange returned {len(parts)} entries for "
                                 f"{self.size} ranks")
        used = 0
        addrs: List[bytes] = []
        nodes: List[bytes] = []
        nb = _MAX_TEAMS // 8
        for r, p in enumerate(parts):
            if len(p) < _BOOT.size + nb:
                raise TransportError(f"ucx: rank {r} sent a malformed bootstrap record ({len(p)} B)")
            magic, version, size, alen, nlen = _BOOT.unpack_from(p)
            if magic != _MAGIC or version != _VERSION or size != self.size \
                    or len(p) != _BOOT.size + nb + alen + nlen:
                raise TransportError(f"ucx: rank {r} sent an incompatible bootstrap record (magic "
                                     f"{magic:#x}, version {version}, team size {size})")
            used |= int.from_bytes(p[_BOOT.size:_BOOT.size + nb], "little")
            addrs.append(p[_BOOT.size + nb:_BOOT.size + nb + alen])
            nodes.append(p[_BOOT.size + nb + alen:])
        tid = next((t for t in range(_MAX_TEAMS) if not used >> t & 1), None)
        if tid is None:
            raise TransportError(f"ucx: no team id free on every rank ({_MAX_TEAMS} UCX teams open)")
        self.team_id = tid
        w.team_ids.add(tid)
        self.team_bits = tid << _TEAM_SHIFT
        self._errflags = _ffi.new("int[]", self.size)
        self._failed: Dict[int, TransportError] = {}
        self._eps: List[Any] = []
        self._addrs = [_ffi.from_buffer(a) for a in addrs]  # kept alive with the endpoints
        epp = _ffi.new("ucp_ep_h *")
        self.peer_errors = _peer_modes(nodes, node)
        self._watch_errors = any(self.peer_errors)
        try:
            for r in range(self.size):
                st = _lib.pc_ucx_ep_create(self.worker, self._addrs[r], self.peer_errors[r],
                                           self._errflags + r, epp)
                if st != _OK:
                    raise TransportError(f"ucx: cannot connect to rank {r}: {_status(st)}")
                self._eps.append(epp[0])
        except BaseException:
            self._close_eps(force=True)
            w.team_ids.discard(tid)
            raise
        self._st = _ffi.new("int *")
        self._msgp = _ffi.new("void **")
        self._tagp = _ffi.new("uint64_t *")
        self._lenp = _ffi.new("size_t *")
        self._live: Dict[int, _Req] = {}  # requests UCP still holds (their buffers stay alive)
        self._stash: Dict[int, deque] = defaultdict(deque)  # untagged arrivals by wire tag
        self._kstash: Dict[Tuple[int, int, int], deque] = defaultdict(deque)  # checked, by key
        self._waiting: Dict[Tuple[int, int, int], deque] = defaultdict(deque)  # checked receives
        self._wwait: Dict[int, deque] = defaultdict(deque)  # the same, by wire tag
        self._nwaiting = 0
        self._pulls: List[_Pull] = []
        self._byes = 0
        #: Seconds a peer's host may leave data unacknowledged (PYCOLL_PEER_SILENCE, applied to
        #: UCX's TCP connections: see _tcp_settings); pings while this rank waits (check_silence).
        self.silence = _silence()
        self._pinged = [0.0] * self.size
        self._pings: List[_Req] = []

    def __repr__(self) -> str:
        return f"<UCXTransport rank {self.rank}/{self.size} team id {getattr(self, 'team_id', '?')}>"

    def channel(self, key: tuple) -> Channel:
        return UCXChannel(self, key, self._stash)

    def _check(self, peer: int) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"ucx: peer {peer} is not a rank of a team of {self.size}")
        err = self._failed.get(peer)
        if err is not None:
            raise err
        if self._closed:
            raise TransportError("ucx: the transport is closed")

    def _wire(self, peer: int, tag: Hashable) -> Tuple[int, int, int, bool]:
        """(wire tag, key hash or 0, step, checked) of a message from/to ``peer`` (the source
        field is the sender's rank)."""
        if type(tag) is tuple and len(tag) == 4 and tag[2] == "agree" and tag[0] == "c":  # (as fast ones)
            step = tag[3]
            return self.untagged_base(tag[:3]) | (peer << _SRC_SHIFT) | (step & _STEP_MASK), 0, step, False
        prefix, step, checked = split_key(tag)
        if not checked:
            return (self.team_bits | (peer << _SRC_SHIFT) | ((prefix[1] & _KEY_MASK) << _KEY_SHIFT)
                    | (step & _STEP_MASK)), 0, step, False
        h = key_hash(prefix)
        return (_CHECKED | self.team_bits | (peer << _SRC_SHIFT) | ((h & _KEY_MASK) << _KEY_SHIFT)
                | (step & _STEP_MASK)), h, step, True

    # ------------------------------------------------------------------ sends
    def isend(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        return self._send(buf, peer, tag, None)

    def isend_marked(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Mark) -> TransportRequest:
        return self._send(buf, peer, tag, mark)

    def _send(self, buf: np.ndarray, peer: int, tag: Hashable, mark: Optional[Mark]) -> TransportRequest:
        """A send of ``buf`` (``mark``: behind it; None: unmarked), counted. (isend and
        isend_marked each call it, so that a bandwidth limit wraps each once.)"""
        wire, h, step, checked = self._wire(self.rank, tag)
        req = self.send_wire(buf, peer, wire, tag, (h, step) if checked else None, mark)
        self.traffic.sent(peer, buf.nbytes)
        return req

    def send_wire(self, buf: np.ndarray, peer: int, wire: int, tag: Hashable,
                  checked: Optional[Tuple[int, int]], mark: Optional[Mark] = None) -> TransportRequest:
        """Send ``buf`` to ``peer`` on UCP tag ``wire`` (made by the caller: :meth:`isend`, or a
        channel's fast path), with the header ``(key hash, step)`` of a checked key in front, or
        else ``mark`` (the two parts as one message). Counts no traffic (the callers do)."""
        if peer in self._failed or not 0 <= peer < self.size or self._closed:
            self._check(peer)
        req = _Req("send", peer, tag, buf.nbytes)
        st = self._st
        if checked is None and mark is None:
            ucp = _lib.pc_ucx_send(self._eps[peer], _ffi.from_buffer(buf), buf.nbytes, wire, st)
            keep: Any = buf
        elif checked is None:
            iov = _ffi.new("ucp_dt_iov_t[2]")
            hdr = _ffi.from_buffer(mark.buf)  # type: ignore[union-attr]
            ucp = _lib.pc_ucx_send2(self._eps[peer], iov, hdr, MARK_BYTES, _ffi.from_buffer(buf), buf.nbytes,
                                    wire, st)
            keep = (buf, hdr, iov, mark)
        else:
            if mark is None:
                hdr = _HEADER.pack(checked[0], checked[1], _MAGIC, _VERSION, _NO_MARK)
            else:
                hdr = _HEADER.pack(checked[0], checked[1], _MAGIC, _VERSION | _MARKED, mark.blob)
            iov = _ffi.new("ucp_dt_iov_t[2]")
            ucp = _lib.pc_ucx_send2(self._eps[peer], iov, hdr, len(hdr), _ffi.from_buffer(buf), buf.nbytes,
                                    wire, st)
            keep = (buf, hdr, iov)
        s = st[0]
        if s == _OK:
            req.done = True
        elif s == _INPROGRESS:
            req.ucp, req.transport, req.keep = ucp, self, keep
            self._live[id(req)] = req
        else:
            req.error = TransportError(f"ucx: send of {buf.nbytes} B to rank {peer} (tag {tag!r}) failed: "
                                       f"{_status(s)}")
        return req

    # ------------------------------------------------------------------ receives
    def irecv(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        return self.irecv_marked(buf, peer, tag, None)

    def irecv_marked(self, buf: np.ndarray, peer: int, tag: Hashable,
                     mark: Optional[Mark]) -> TransportRequest:
        wire, h, step, checked = self._wire(peer, tag)
        if not checked:
            return self.recv_wire(buf, peer, wire, tag, mark)
        self._check(peer)
        req = _CRecv("recv", peer, tag, buf.nbytes)
        req.buf, req.k, req.wire, req.busy, req.canceled, req.transport = buf, (peer, h, step), wire, False, \
            False, self
        req.mark = mark
        stashed = self._kstash.get(req.k)
        if stashed:
            theirs, data = stashed.popleft()
            if not stashed:
                del self._kstash[req.k]
            self.unexpected_taken(h)
            self._give(req, theirs, data)
            return req
        self._waiting[req.k].append(req)
        self._wwait[wire].append(req)
        self._nwaiting += 1
        self._pull(_CHECKED | self.team_bits, _CHECKED | _TEAM_FIELD)
        return req

    def recv_wire(self, buf: np.ndarray, peer: int, wire: int, tag: Hashable,
                  mark: Optional[Mark] = None) -> TransportRequest:
        """Receive an untagged message from ``peer`` on UCP tag ``wire`` (made by the caller:
        :meth:`irecv`, or a channel's fast path) into ``buf``: from the stash if it is there
        (``mark``: a marked one, whose mark it compares)."""
        if peer in self._failed or not 0 <= peer < self.size or self._closed:
            self._check(peer)
        req = _Req("recv", peer, tag, buf.nbytes)
        req.mark = mark
        stashed = self._stash.get(wire)
        if stashed:
            item = stashed.popleft()
            if not stashed:
                del self._stash[wire]
            self.unexpected_taken(("slot", (wire >> _KEY_SHIFT) & _KEY_MASK))
            if isinstance(item, np.ndarray):
                self.give_raw(req, buf, item)
            else:  # still arriving: it completes this receive when it has
                req.buf, req.ucp, req.transport = buf, None, self
                item.waiter = req
            return req
        req.info = _ffi.new("ucp_tag_recv_info_t *")
        st = self._st
        if mark is None:
            ucp = _lib.pc_ucx_recv(self.worker, _ffi.from_buffer(buf), buf.nbytes, wire, _FULL, req.info, st)
        else:
            req.hdr = hdr = bytearray(MARK_BYTES)
            req.buf = buf
            iov = req.keep = _ffi.new("ucp_dt_iov_t[2]")
            ucp = _lib.pc_ucx_recv2(self.worker, iov, _ffi.from_buffer(hdr), MARK_BYTES,
                                    _ffi.from_buffer(buf), buf.nbytes, wire, _FULL, req.info, st)
        s = st[0]
        req.transport = self
        if s == _OK:
            self.complete_request(req, s)
        elif s == _INPROGRESS:
            req.ucp, req.buf = ucp, buf
            self._live[id(req)] = req
        else:
            self.complete_request(req, s)
        return req

    def complete_request(self, req: _Req, st: int) -> None:
        """The UCP request of ``req`` ended with status ``st`` (seen by its ``test``): UCP holds its
        buffer no more; it completes (counted as received) or fails."""
        self._live.pop(id(req), None)
        mark = req.mark if req.kind == "recv" else None
        if mark is not None and st in (_OK, _TRUNCATED):
            n = req.info.length - MARK_BYTES if st == _OK else -1
            if unmarked(req, mark, req.hdr, n, req.buf.nbytes):
                req.nbytes = n
                self.traffic.received(req.peer, n)
                req.done = True
        elif st == _OK:
            if req.kind == "recv":
                req.nbytes = req.info.length
                self.traffic.received(req.peer, req.nbytes)
            req.done = True
        elif st == _TRUNCATED:
            req.error = TransportError(f"ucx: a message from rank {req.peer} (tag {req.tag!r}) is "
                                       f"larger than the receive buffer of {req.nbytes} B "
                                       "(UCS_ERR_MESSAGE_TRUNCATED)")
        elif st == _CANCELED:
            req.error = TransportError(f"ucx: {req.kind} with rank {req.peer} (tag {req.tag!r}) was canceled")
        else:
            err = self._failed.get(req.peer)
            req.error = err or TransportError(
                f"ucx: {req.kind} {'to' if req.kind == 'send' else 'from'} rank {req.peer} (tag {req.tag!r}) "
                f"failed: {_status(st)}")
        req.keep = None

    def probe(self, peer: int, tag: Hashable) -> bool:
        self._check(peer)
        wire, h, step, checked = self._wire(peer, tag)
        if not checked:
            if self._stash.get(wire):
                return True
            _lib.pc_ucx_progress(self.worker, 4)
            return bool(_lib.pc_ucx_probe(self.worker, wire, _FULL, 0, self._msgp, self._tagp, self._lenp))
        _lib.pc_ucx_progress(self.worker, 4)
        self._pull(wire, _FULL)
        return bool(self._kstash.get((peer, h, step)))

    # ------------------------------------------------------------------ taking probed messages
    def _pull(self, tag: int, mask: int) -> int:
        """Take every message matching (tag, mask) that waits unreceived; return how many."""
        n = 0
        probe, worker, msgp, tagp, lenp = _lib.pc_ucx_probe, self.worker, self._msgp, self._tagp, self._lenp
        while probe(worker, tag, mask, 1, msgp, tagp, lenp):
            n += 1
            self._take(msgp[0], tagp[0], lenp[0])
        return n

    def _take(self, msg: Any, wire: int, length: int) -> None:
        p = _Pull(wire)
        st = self._st
        if not wire & _CHECKED:
            p.data = np.empty(length, _U8)
            p.ucp = _lib.pc_ucx_msg_recv(self.worker, msg, _ffi.NULL, _ffi.NULL, 0, _ffi.from_buffer(p.data),
                                         length, p.info, st)
            s = st[0]
            self._stash[wire].append(p if s == _INPROGRESS else p.data)
            self.unexpected_arrived(("slot", (wire >> _KEY_SHIFT) & _KEY_MASK))
            if s == _INPROGRESS:
                self._pulls.append(p)
            elif s != _OK:
                raise TransportError(f"ucx: receiving a message from rank {(wire >> _SRC_SHIFT) & _SRC_MASK} "
                                     f"failed: {_status(s)}")
            return
        if wire & _LOW >= _LOW - 1 and length == 0:  # a peer's close barrier, or a ping
            p.ucp = _lib.pc_ucx_msg_recv(self.worker, msg, _ffi.NULL, _ffi.NULL, 0, _ffi.NULL, 0, p.info, st)
            if wire & _LOW == _LOW:
                self._byes += 1
            if st[0] == _INPROGRESS:
                self._pulls.append(p)  # freed when it completes (nothing to route)
            return
        src = (wire >> _SRC_SHIFT) & _SRC_MASK
        if length < _HEADER.size:
            raise TransportError(f"ucx: rank {src} sent a {length}-byte message without a header on tag "
                                 f"{wire:#x}")
        n = p.nbytes = length - _HEADER.size
        target = None
        for r in self._wwait.get(wire, ()):
            if not r.busy:
                target = r if r.buf.nbytes >= n else None
                break
        p.hdr = np.empty(_HEADER.size, _U8)
        p.iov = _ffi.new("ucp_dt_iov_t[2]")
        if target is not None:
            target.busy = True
            p.target = target
            dst = target.buf
        else:
            dst = p.data = np.empty(n, _U8)
        p.ucp = _lib.pc_ucx_msg_recv(self.worker, msg, p.iov, _ffi.from_buffer(p.hdr), _HEADER.size,
                                     _ffi.from_buffer(dst), n, p.info, st)
        s = st[0]
        if s == _INPROGRESS:
            self._pulls.append(p)
        else:
            p.ucp = None
            self._landed(p, s)

    def _landed(self, p: _Pull, st: int) -> None:
        """A taken message finished arriving: route it (see the module doc)."""
        wire = p.wire
        src = (wire >> _SRC_SHIFT) & _SRC_MASK
        if not wire & _CHECKED:
            waiter = p.waiter
            if st != _OK:
                err = TransportError(f"ucx: receiving a message from rank {src} failed: {_status(st)}")
                if waiter is None:
                    raise err
                waiter.error = err
                return
            if waiter is not None:
                self.give_raw(waiter, waiter.buf, p.data)
            else:  # still in the stash: replace the placeholder by the data
                q = self._stash.get(wire)
                if q is not None:
                    for i, item in enumerate(q):
                        if item is p:
                            q[i] = p.data
                            break
            return
        if p.hdr is None:  # a close barrier message
            return
        t = p.target
        if t is not None:
            t.busy = False
        if st != _OK:
            err = self._failed.get(src) or TransportError(
                f"ucx: receiving a message from rank {src} failed: {_status(st)}")
            if t is not None and not t.done:
                t.error = err
                self.unwait(t)
                return
            raise err
        khash, step, magic, version, mark = _HEADER.unpack(p.hdr.tobytes())
        if magic != _MAGIC or version & ~_MARKED != _VERSION or (step & _STEP_MASK) != (wire & _STEP_MASK) \
                or (khash & _KEY_MASK) != (wire >> _KEY_SHIFT) & _KEY_MASK:
            raise TransportError(f"ucx: malformed header from rank {src} on tag {wire:#x}")
        theirs = mark if version & _MARKED else None
        k = (src, khash, step)
        n = p.nbytes
        if t is not None:
            if t.k == k and not t.canceled:
                self.unwait(t)
                if t.mark is None or unmarked(t, t.mark, theirs or b"", n, t.buf.nbytes):
                    t.nbytes = n
                    t.done = True
                    self.traffic.received(src, n)
                return
            data = t.buf[:n].copy()  # not this receive's message (a 20-bit collision): move it
            if t.canceled:
                self.unwait(t)
        else:
            data = p.data
        q = self._waiting.get(k)
        r = next((r for r in q if not r.busy), None) if q else None
        if r is not None:
            self.unwait(r)
            self._give(r, theirs, data)
        else:
            self._kstash[k].append((theirs, data))
            self.unexpected_arrived(khash)
        if t is not None and not t.canceled:  # its own message may have been kept meanwhile
            q = self._kstash.get(t.k)
            if q:
                theirs, data = q.popleft()
                if not q:
                    del self._kstash[t.k]
                self.unexpected_taken(t.k[1])
                self.unwait(t)
                self._give(t, theirs, data)

    def _give(self, req: Any, theirs: Optional[bytes], data: np.ndarray) -> None:
        """Complete receive ``req`` of a checked key with a message that came (its header's mark
        ``theirs``, None: unmarked) and was kept in ``data``."""
        if req.mark is None or unmarked(req, req.mark, theirs or b"", data.nbytes, req.buf.nbytes):
            deliver("ucx", req, req.buf, data, self.traffic)

    def give_raw(self, req: _Req, buf: np.ndarray, data: np.ndarray) -> None:
        """Complete untagged receive ``req`` into ``buf`` with a message taken before it was posted
        (``data``, as it came: the mark first, for a marked receive)."""
        mark = req.mark
        if mark is None:
            deliver("ucx", req, buf, data, self.traffic)
            return
        n = data.nbytes - MARK_BYTES
        if unmarked(req, mark, data[:MARK_BYTES].tobytes(), n, buf.nbytes):
            deliver("ucx", req, buf, data[MARK_BYTES:], self.traffic)

    def unwait(self, r: _CRecv) -> None:
        """Stop waiting for the message of checked receive ``r`` (it arrived, failed, or ``r`` was
        canceled)."""
        q = self._waiting.get(r.k)
        if q is None or r not in q:
            return
        q.remove(r)
        if not q:
            del self._waiting[r.k]
        q = self._wwait[r.wire]
        q.remove(r)
        if not q:
            del self._wwait[r.wire]
        self._nwaiting -= 1

    # ------------------------------------------------------------------ engine side
    def progress(self) -> int:
        moved = _lib.pc_ucx_progress(self.worker, 16)
        if self._nwaiting:
            moved += self._pull(_CHECKED | self.team_bits, _CHECKED | _TEAM_FIELD)
        if self._pulls:
            moved += self._test_pulls()
        if self._watch_errors and _lib.pc_ucx_first_error(self._errflags, self.size) >= 0:
            self._peer_errors()
        if self._held:
            self._held = [h for h in self._held if not h[1]()]
        return moved

    def _test_pulls(self) -> int:
        done = 0
        still = []
        for p in self._pulls:
            st = _lib.pc_ucx_test(p.ucp, 1, p.info)
            if st == _INPROGRESS:
                still.append(p)
                continue
            p.ucp = None
            done += 1
            self._landed(p, st)
        self._pulls = still
        return done

    def _peer_errors(self) -> None:
        for r in range(self.size):
            st = self._errflags[r]
            if not st or r in self._failed:
                continue
            err = self._failed[r] = PeerLostError(
                f"ucx: lost rank {r}: its endpoint failed ({_status(st)}): its process ended, or its host "
                f"stopped answering for {self.silence:g} s (gone, or cut off the network)", rank=r,
                how=_status(st))
            for req in list(self._live.values()):
                if req.peer == r and not req.done:
                    req.error = err
                    if req.kind == "recv":
                        _lib.pc_ucx_cancel(self.worker, req.ucp)
            for k in [k for k in self._waiting if k[0] == r]:
                for req in list(self._waiting[k]):
                    req.error = err
                    if not req.busy:
                        self.unwait(req)

    # ------------------------------------------------------------------ native programs
    def native(self) -> Tuple[Any, Any]:
        """The binding's cffi ``(ffi, lib)`` (the program executor is in it)."""
        return _ffi, _lib

    def endpoints(self) -> Any:
        """The endpoints to every rank as a C array (``ucp_ep_h[size]``), made once."""
        if self._eps_array is None:
            self._eps_array = _ffi.new("ucp_ep_h[]", self._eps)
        return self._eps_array

    def error_flags(self) -> Any:
        """The per-rank endpoint error flags (``int[size]``; nonzero: that rank's endpoint failed)."""
        return self._errflags

    def status_text(self, st: int) -> str:
        """UCX's words for status ``st``."""
        return _status(st)

    def native_started(self) -> None:
        """A native program started: until it ends, :meth:`poll_unexpected` takes nothing into the
        stash (the program's receives are posted to UCP by C and would not see it)."""
        self._native += 1

    def native_ended(self) -> None:
        """A native program finished, failed or was cancelled."""
        self._native -= 1

    def keep_until_done(self, owner: Any, done: Callable[[], bool]) -> None:
        """Keep ``owner`` (and so the buffers UCX still uses) until ``done()``, asked as the
        transport progresses."""
        self._held.append((owner, done))

    def untagged_base(self, key: tuple) -> int:
        """The wire tag of untagged collective ``key`` (``("c", seq)``, or its agreement check's
        exchange ``("c", seq, "agree")``) without sender and step."""
        if key[0] != "c" or (len(key) > 2 and key[2:] != ("agree",)):
            raise TransportError(f"ucx: native programs run untagged collectives, not {key!r}")
        return self.team_bits | ((key[1] & _KEY_MASK) << _KEY_SHIFT) | (_AGREE if len(key) > 2 else 0)

    #: What an agreement check's exchange adds to its collective's wire tags (see untagged_base).
    agree_bit = _AGREE
    #: Its native programs carry marks (``native/exec_ucx.c``).
    program_marks = True

    def program_task(self, args: Any, program: Any, credit_bytes: int, check: Optional[tuple] = None) -> Any:
        """A task running ``program`` natively for ``args`` (see :mod:`pycoll.tl.ucx.executor`),
        or None where it must run in Python: under a credit limit (``credit_bytes``), a bandwidth
        limit, or for a tagged key (``("unkeyed",)``: a task being built, keyed untagged later).
        ``check``: ``(exchange program, fingerprint, explain)`` of the agreement check the
        program runs first (:class:`pycoll.tl.ucx.executor.Check`)."""
        if credit_bytes or self.limited or args.channel.key[0] not in ("c", "unkeyed") or self._closed:
            return None
        from pycoll.tl.ucx.executor import UCXProgramTask, prepared  # noqa: PLC0415

        return UCXProgramTask(args, prepared(self, self._programs, program, check))

    def check_silence(self) -> bool:
        """Ping every peer on another node that this rank waits on and has not pinged for a sixth
        of :attr:`silence`: a zero-byte message that its transport drops, so that an idle
        connection has data to acknowledge and a host that stopped answering fails its endpoint
        within the silence (UCX's TCP ``TCP_USER_TIMEOUT``). Take the pings that arrived. The
        engine's watch while it waits, under its lock. True: go on watching."""
        if self._closed:
            return False
        self._pull(_PING | self.team_bits, _FULL & ~(_SRC_MASK << _SRC_SHIFT))
        self._pings = [q for q in self._pings if not _finished(q)]
        now = time.monotonic()
        waited = {req.peer for req in self._live.values()} | {k[0] for k in self._waiting}
        for r in waited:
            if self.peer_errors[r] and r not in self._failed and now - self._pinged[r] > self.silence / 6:
                self._pinged[r] = now
                self._pings.append(self.send_wire(np.empty(0, _U8), r,
                                                  _PING | self.team_bits | (self.rank << _SRC_SHIFT), "ping",
                                                  None))
        return True

    def stray(self, key: tuple, mark: Mark) -> Optional[Tuple[int, bytes, int]]:
        # (only what the stash holds: pulling the messages that wait would take a native program's
        # that has not started yet, whose C receives never look in the stash; see executor)
        prefix, _, checked = split_key((*key, 0))
        if not checked:
            slot = prefix[1] & _KEY_MASK
            for wire, q in self._stash.items():
                if not wire & (_CHECKED | _AGREE) and (wire >> _KEY_SHIFT) & _KEY_MASK == slot:
                    for data in q:
                        if isinstance(data, np.ndarray) and data[:MARK_BYTES].tobytes() != mark.blob:
                            return (wire >> _SRC_SHIFT) & _SRC_MASK, data[:MARK_BYTES].tobytes(), \
                                data.nbytes - MARK_BYTES
            return None
        khash = key_hash(prefix)
        for (src, h, _), q in self._kstash.items():
            for theirs, data in q:
                if h == khash and theirs != mark.blob:
                    return src, theirs or b"", data.nbytes
        return None

    def poll_unexpected(self) -> None:
        _lib.pc_ucx_progress(self.worker, 16)
        if self._native:  # (credit-blocked work starts on demand once the native programs are done)
            return
        self._pull(self.team_bits, _TEAM_FIELD)
        if self._pulls:
            self._test_pulls()

    def demand_id(self, key: tuple) -> Hashable:
        if key[0] == "c" and key[2:] == ("agree",):  # (its messages arrive on the collective's slot)
            return ("slot", key[1] & _KEY_MASK)
        prefix, _, checked = split_key((*key, 0))
        if not checked:
            return ("slot", prefix[1] & _KEY_MASK)
        return key_hash(prefix)

    def pending(self) -> List[str]:
        """What is stashed or awaited (for diagnostics)."""
        return [f"stash {k:#x}: {len(q)}" for k, q in self._stash.items()] + \
            [f"kstash {k}: {len(q)}" for k, q in self._kstash.items()] + \
            [f"waiting {k}: {len(q)}" for k, q in self._waiting.items()] + \
            [f"live {r!r}" for r in self._live.values()]

    # ------------------------------------------------------------------ shutdown
    def _drive(self, until: Callable[[], bool], seconds: float) -> bool:
        """Progress until ``until()`` or ``seconds`` pass (yielding the core when idle)."""
        deadline = time.monotonic() + seconds
        idle = 0
        while not until():
            if time.monotonic() > deadline:
                return False
            if self.progress():
                idle = 0
            else:
                idle += 1
                if idle > 100:
                    time.sleep(0.0005)
        return True

    def _close_eps(self, force: bool) -> None:
        st = self._st if hasattr(self, "_st") else _ffi.new("int *")
        reqs = []
        for ep in self._eps:
            ucp = _lib.pc_ucx_ep_close(ep, 1 if force else 0, st)
            if st[0] == _INPROGRESS:
                reqs.append(ucp)
        self._eps = []
        info = _ffi.new("ucp_tag_recv_info_t *")

        def closed() -> bool:
            reqs[:] = [r for r in reqs if _lib.pc_ucx_test(r, 0, info) == _INPROGRESS]
            return not reqs

        deadline = time.monotonic() + 5.0
        while not closed() and time.monotonic() < deadline:
            if not _lib.pc_ucx_progress(self.worker, 16):
                time.sleep(0.0002)

    def _flush(self, seconds: float) -> bool:
        """Flush every endpoint of this team (progressing the worker); whether all finished."""
        st = _ffi.new("int *")
        info = _ffi.new("ucp_tag_recv_info_t *")
        reqs = []
        for r, ep in enumerate(self._eps):
            if r == self.rank:
                continue
            ucp = _lib.pc_ucx_ep_flush(ep, st)
            if st[0] == _INPROGRESS:
                reqs.append(ucp)
            elif st[0] != 0:
                return False

        def flushed() -> bool:
            reqs[:] = [q for q in reqs if _lib.pc_ucx_test(q, 0, info) == _INPROGRESS]
            return not reqs

        return self._drive(flushed, seconds)

    def close(self) -> None:
        if self._closed or self.worker is None:
            return
        try:
            self._shutdown()
        finally:
            self._closed = True
            self._w.team_ids.discard(self.team_id)
            _release(self.ctx, self._w)
            self.worker = None

    def _shutdown(self) -> None:
        # 1. withdraw what is still posted; wait (briefly) for UCP to let go of every buffer
        for req in list(self._live.values()):
            if req.kind == "recv" and req.ucp is not None:
                _lib.pc_ucx_cancel(self.worker, req.ucp)
        for k in list(self._waiting):
            for r in list(self._waiting.get(k, ())):
                r.canceled = True
                if not r.busy:
                    self.unwait(r)

        def settled() -> bool:
            for req in list(self._live.values()):
                req.error = None
                try:
                    req.test()
                except TransportError:
                    pass
            return not self._live and not self._pulls

        self._drive(settled, 5.0)
        failed = bool(self._failed) or _lib.pc_ucx_first_error(self._errflags, self.size) >= 0
        # 2. a UCX barrier: every rank's messages to us have arrived once its "bye" has
        if not failed and self.size > 1:
            empty = np.empty(0, _U8)
            byes = [self.send_wire(empty, r, _BYE | self.team_bits | (self.rank << _SRC_SHIFT), "bye", None)
                    for r in range(self.size) if r != self.rank]

            def all_byes() -> bool:
                self._pull(_BYE | self.team_bits, _FULL & ~(_SRC_MASK << _SRC_SHIFT))
                sent = all(b.done or b.error is not None or (b.test() if b.ucp is not None else False)
                           for b in byes)
                return sent and self._byes >= self.size - 1

            if not self._drive(all_byes, 10.0):
                _log.warning("ucx: closing team %d on rank %d: %d of %d byes after 10 s", self.team_id,
                             self.rank, self._byes, self.size - 1)
            # 2b. flush: our byes (and everything before them) have reached every peer. A send that
            # completed locally may not have left yet, and the barrier below does not progress UCX.
            if not self._flush(10.0):
                _log.warning("ucx: closing team %d on rank %d: flush unfinished after 10 s", self.team_id,
                             self.rank)
        # Only a peer known to be gone skips the barrier: a rank that skipped it on a slow bye
        # would leave the others in it for good.
        # 3. a bootstrap barrier (nobody talks to us any more), then close the endpoints: forced,
        # as every message has arrived (a flushing close is a handshake with the peer's worker,
        # which a peer blocked in the barrier does not progress: measured 5 s stalls). The barrier
        # progresses the worker where the bootstrap has one that can (else a peer still in its
        # flush waits for our progress: over TCP between hosts, 10 s on every close).
        if not failed:
            try:
                if self._barrier is not None:
                    self._barrier(self.progress)
                else:
                    self._allgather(b"")
            except Exception:  # noqa: BLE001 - a peer gone at close: nothing more to wait for
                failed = True
        if self._w.refs > 1:  # other teams still use the worker: keep the endpoints until it goes
            self._w.retired.append((self._eps, self._errflags, self._addrs))
            self._eps = []
        else:
            self._close_eps(force=True)
        # 4. leftovers of this team (its id may be reused): take them and drop them
        self._pull(self.team_bits, _TEAM_FIELD)
        self._drive(lambda: not self._pulls, 2.0)
        self._stash.clear()
        self._kstash.clear()
        self._live.clear()
