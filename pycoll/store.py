"""A small TCP key-value store for bootstrapping teams without MPI (``Team.from_store``).

It has the interface of torch's c10d ``Store`` that pycoll uses (``set``, ``get`` blocking until the
key exists, ``add``, ``compare_set``, ``wait``, ``check``, ``delete_key``), so a c10d store can be
passed instead.
One process (``is_master=True``) runs the server in a thread; every process connects as a client.
The server closes its connections when its process exits (its threads would stop answering while
the connections stayed open: the clients would wait their whole timeout), so a client learns at
once that the store is gone (a :class:`pycoll.PycollError`); the process that serves the store must
outlive its clients' last use of it, as for c10d's TCPStore.

Wire protocol, one request and one reply per round trip (all integers little-endian)::

    request: op u8, key length u32, key, value length u64, value
    reply:   status u8 (0 ok, 1 timeout, 2 error), value length u64, value

The server bounds what any client, a stranger's included, can make it do (see
docs/guide/security.md): a key of at most :data:`MAX_KEY_BYTES` (a request's keys together at most
:data:`MAX_KEYS_BYTES`), a value of at most :data:`MAX_VALUE_BYTES`, at most ``max_stored`` bytes
held, ``max_connections`` clients at once, and a request that has begun must arrive whole within
``request_timeout`` seconds. A request past a limit or malformed (an unknown op, a key that is not
UTF-8, a non-numeric ``add``) gets an error answer; one whose length says more than a limit, or
that does not arrive in time, gets its error answer and its connection is closed. Any error is a
:class:`pycoll.PycollError` in the client that asked, and the client checks its own requests
against the limits before sending them. The server does not know who asks: a team's entries are
made safe by their MACs (:mod:`pycoll.auth`), not by the store.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import socket
import struct
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Union

from pycoll.errors import PycollError, TimeoutError

_SET, _GET, _ADD, _CHECK, _DELETE, _WAIT, _CAS = range(7)
_REQ = struct.Struct("<BI")
_LEN = struct.Struct("<Q")
_REP = struct.Struct("<BQ")
_OK, _TIMEOUT, _ERR = 0, 1, 2
#: The longest key, and the longest key field of a request (``check``/``wait`` join their keys).
MAX_KEY_BYTES = 4096
MAX_KEYS_BYTES = 1 << 20
#: The longest value: pycoll's own are far shorter (addresses, a UCX worker's address of a few KiB,
#: the questions and answers of a timed-out collective of at most 16 KiB).
MAX_VALUE_BYTES = 256 << 10
#: Defaults of the server's limits: bytes held (keys and values), clients at once, and seconds a
#: request that has begun may take to arrive whole.
MAX_STORED_BYTES = 256 << 20
MAX_CONNECTIONS = 1024
REQUEST_S = 30.0
_ENTRY_BYTES = 64  # (what an entry costs beyond its key and value, as the server counts)
_INT64 = 1 << 63
_NO_LIMIT = 1e9  # (seconds: a longer timeout, or inf, waits for ever)
log = logging.getLogger("pycoll")


class _Refused(Exception):
    """A request the server answers with an error; ``close``: and then closes the connection."""

    def __init__(self, why: str, close: bool = False) -> None:
        super().__init__(why)
        self.close = close


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("store connection closed")
        got += k
    return bytes(buf)


class _Reader:
    """A client's bytes as the server reads them: a buffer filled up to 64 KiB a read (a request
    mostly arrives whole in one), every read waiting at most ``wait`` seconds, so that a request's
    ``deadline`` is looked at at least that often."""

    def __init__(self, conn: socket.socket, wait: float) -> None:
        self.conn, self.buf = conn, bytearray()
        conn.settimeout(wait)

    def take(self, n: int, deadline: Optional[float] = None) -> bytes:
        """The next ``n`` bytes; with ``deadline`` (time.monotonic()), :class:`_Refused` once it
        passes before they came (without one, a client may stay quiet as long as it likes)."""
        while len(self.buf) < n:
            if deadline is not None and time.monotonic() > deadline:
                raise _Refused(f"the request did not arrive whole in time ({len(self.buf)} of {n} B)",
                               close=True)
            try:
                chunk = self.conn.recv(65536)
            except socket.timeout:  # noqa: UP041 - (this module imports pycoll.TimeoutError)
                continue
            if not chunk:
                raise ConnectionError("store connection closed")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


class _Server:
    """The store's server: a thread per client (at most ``max_connections``); ``get``/``wait``
    block on a condition. See the module docstring for its limits."""

    def __init__(self, host: str, port: int, max_connections: int = MAX_CONNECTIONS,
                 max_stored: int = MAX_STORED_BYTES, request_timeout: float = REQUEST_S) -> None:
        self.data: Dict[str, bytes] = {}
        self.stored = 0  # bytes held, as _cost counts them
        self.max_connections, self.max_stored = max_connections, max_stored
        self.request_timeout = request_timeout
        self.cond = threading.Condition()
        self.sock = socket.create_server((host, port), reuse_port=False)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        self.conns: List[socket.socket] = []
        atexit.register(self.close)  # (before the interpreter stops its threads: see the module docstring)
        threading.Thread(target=self._accept, name="pycoll-store", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.cond:
                full = len(self.conns) >= self.max_connections
                if not full:
                    self.conns.append(conn)
            if full:  # its first request's answer says why, and it is closed
                log.warning("pycoll: store: refused a connection: %d clients already", self.max_connections)
                why = f"store: too many connections (at most {self.max_connections})"
                with contextlib.suppress(OSError):
                    conn.settimeout(1.0)
                    self._answer(conn, _ERR, why.encode())
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket, status: int, reply: bytes) -> None:
        """Send an answer (within the connection's timeout: an honest client reads its answers)."""
        conn.sendall(_REP.pack(status, len(reply)) + reply)

    def _serve(self, conn: socket.socket) -> None:
        """Answer ``conn``'s requests until it closes, or a request makes the server close it."""
        reader = _Reader(conn, self.request_timeout)
        try:
            while True:
                try:
                    first = reader.take(1)  # (a client may be quiet between requests as long as it likes)
                    status, reply = self._request(reader, first, time.monotonic() + self.request_timeout)
                except _Refused as refused:
                    self._answer(conn, _ERR, f"store: {refused}".encode())
                    if refused.close:
                        log.warning("pycoll: store: closed a connection: %s", refused)
                        return
                    continue
                self._answer(conn, status, reply)
        except (ConnectionError, OSError):
            pass
        except Exception:  # noqa: BLE001 - never a thread that dies with its connection open
            log.warning("pycoll: store: closed a connection after an error", exc_info=True)
        finally:
            with self.cond:
                if conn in self.conns:
                    self.conns.remove(conn)
            conn.close()

    def _request(self, reader: _Reader, first: bytes, deadline: float) -> tuple:
        """Read the rest of a request that began with ``first`` (by ``deadline``) and answer it:
        ``(status, reply)``; :class:`_Refused` for one past a limit or malformed."""
        op, klen = _REQ.unpack(first + reader.take(_REQ.size - 1, deadline))
        if klen > MAX_KEYS_BYTES:
            raise _Refused(f"a key of {klen} B (at most {MAX_KEYS_BYTES})", close=True)
        head = reader.take(klen + _LEN.size, deadline)
        raw_key, (vlen,) = head[:klen], _LEN.unpack_from(head, klen)
        if vlen > MAX_VALUE_BYTES:
            raise _Refused(f"a value of {vlen} B (at most {MAX_VALUE_BYTES})", close=True)
        value = reader.take(vlen, deadline)
        if op > _CAS:
            raise _Refused(f"an unknown request (op {op})")
        try:
            key = raw_key.decode()
        except UnicodeDecodeError:
            raise _Refused("a key that is not UTF-8") from None
        keys = key.split("\0") if op in (_CHECK, _WAIT) and key else [key]
        if any(len(k.encode()) > MAX_KEY_BYTES for k in keys):
            raise _Refused(f"a key longer than {MAX_KEY_BYTES} B")
        return self._handle(op, key, value)

    @staticmethod
    def _cost(key: str, value: Optional[bytes]) -> int:
        return 0 if value is None else len(key.encode()) + len(value) + _ENTRY_BYTES

    def _put(self, key: str, value: bytes) -> None:
        """Hold ``value`` at ``key`` (under the condition), within the bytes the store may hold."""
        grown = self.stored - self._cost(key, self.data.get(key)) + self._cost(key, value)
        if grown > self.max_stored:
            raise _Refused(f"the store is full ({self.stored} of at most {self.max_stored} B held)")
        self.data[key] = value
        self.stored = grown
        self.cond.notify_all()

    @staticmethod
    def _number(text: bytes, what: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise _Refused(f"{what} is not an integer") from None
        if not -_INT64 <= n < _INT64:
            raise _Refused(f"{what} is out of the 64-bit range")
        return n

    @staticmethod
    def _timeout(value: bytes) -> Optional[float]:
        """A get's or wait's timeout (seconds; None: no limit)."""
        if not value:
            return None
        try:
            t = float(value)
        except ValueError:
            raise _Refused("a timeout that is not a number") from None
        if math.isnan(t) or t < 0:
            raise _Refused(f"a timeout of {t}")
        return None if t >= _NO_LIMIT else t

    def _handle(self, op: int, key: str, value: bytes) -> tuple:
        with self.cond:
            if op == _SET:
                self._put(key, value)
                return _OK, b""
            if op == _ADD:
                n = self._number(self.data.get(key, b"0"), f"the value of {key[:64]!r}") + \
                    self._number(value, "the amount to add")
                if not -_INT64 <= n < _INT64:
                    raise _Refused(f"the sum at {key[:64]!r} is out of the 64-bit range")
                self._put(key, str(n).encode())
                return _OK, str(n).encode()
            if op == _CHECK:
                keys = key.split("\0") if key else []
                return _OK, b"1" if all(k in self.data for k in keys) else b"0"
            if op == _DELETE:
                gone = self.data.pop(key, None)
                self.stored -= self._cost(key, gone)
                return _OK, b"1" if gone is not None else b"0"
            if op == _CAS:  # value: u64 length of expected, expected, desired (c10d's compareSet)
                if len(value) < _LEN.size:
                    return _ERR, b"compare_set: malformed request"
                (n,) = _LEN.unpack_from(value)
                if n > len(value) - _LEN.size:
                    return _ERR, b"compare_set: malformed request"
                expected, desired = value[_LEN.size:_LEN.size + n], value[_LEN.size + n:]
                current = self.data.get(key)
                if (current is None and not expected) or (current is not None and current == expected):
                    self._put(key, desired)
                    current = desired
                return _OK, expected if current is None else current
            timeout = self._timeout(value)
            keys = key.split("\0") if op == _WAIT else [key]
            ok = self.cond.wait_for(lambda: all(k in self.data for k in keys), timeout)
            if not ok:
                return _TIMEOUT, b""
            return _OK, b"" if op == _WAIT else self.data[key]

    def close(self) -> None:
        """Stop listening and end every client's connection (they read end of file at once)."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        self.sock.close()
        with self.cond:
            conns, self.conns = self.conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class TCPStore:
    """A key-value store client (and, with ``is_master``, its server).

    Args:
        host, port: where the server listens (``port=0`` with ``is_master`` picks a free port;
            read it back from ``store.port``). It listens on ``host`` only (127.0.0.1 by
            default: ranks of one host).
        is_master: run the server in this process.
        timeout: seconds a ``get``/``wait`` may block before raising :class:`pycoll.TimeoutError`;
            also how long any request waits for the server's answer beyond that before raising
            :class:`pycoll.PycollError` (a server that stopped answering).
        max_connections, max_stored, request_timeout: the server's limits (see the module
            docstring): clients at once, bytes held, seconds for a request that has begun.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, is_master: bool = False,
                 timeout: float = 300.0, connect_timeout: float = 60.0, *,
                 max_connections: int = MAX_CONNECTIONS, max_stored: int = MAX_STORED_BYTES,
                 request_timeout: float = REQUEST_S) -> None:
        self.host = host
        self.timeout = timeout
        self._server = (_Server(host, port, max_connections, max_stored, request_timeout) if is_master
                        else None)
        self.port = self._server.port if self._server else port
        self._lock = threading.Lock()
        self._broken: Optional[str] = None  # why the connection is unusable (see _call)
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = socket.create_connection((host, self.port), timeout=5)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise PycollError(f"store: cannot connect to {host}:{self.port}: {exc}") from None
                time.sleep(0.05)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _call(self, op: int, key: str, value: bytes = b"", wait: float = 0.0) -> tuple:
        """Send one request and read its answer, which the server gives within ``wait`` seconds
        (a ``get`` or ``wait`` it holds until the keys are set) plus ``timeout``: a server that
        does not answer by then (its process stuck, a host cut off) is a PycollError, here and on
        every later call (the connection is closed: an answer could still come after it)."""
        k = key.encode()
        keys = key.split("\0") if op in (_CHECK, _WAIT) and key else [key]
        if len(k) > MAX_KEYS_BYTES or any(len(one.encode()) > MAX_KEY_BYTES for one in keys):
            raise PycollError(f"store: a key longer than the store takes ({MAX_KEY_BYTES} B; "
                              f"{MAX_KEYS_BYTES} B for the keys of one check or wait): {key[:64]!r}...")
        if len(value) > MAX_VALUE_BYTES:
            raise PycollError(f"store: a value of {len(value)} B at {key[:64]!r}: the store takes at most "
                              f"{MAX_VALUE_BYTES} B (pycoll.store.MAX_VALUE_BYTES)")
        limit = wait + self.timeout
        with self._lock:
            if self._broken is not None:
                raise PycollError(self._broken)
            sock = self._sock
            sock.settimeout(limit if limit < _NO_LIMIT else None)
            try:
                sock.sendall(_REQ.pack(op, len(k)) + k + _LEN.pack(len(value)) + value)
                status, n = _REP.unpack(_recv_exact(sock, _REP.size))
                reply = _recv_exact(sock, n)
            except socket.timeout:  # noqa: UP041 - (this module imports pycoll.TimeoutError)
                self._broken = f"store: {self.host}:{self.port} did not answer within {limit:g} s"
                sock.close()
                raise PycollError(self._broken) from None
            except OSError as exc:  # (ConnectionError too: the server closed the connection)
                self._broken = (f"store: the connection to {self.host}:{self.port} was closed ({exc}): "
                                "the process serving the store ended or closed it")
                sock.close()
                raise PycollError(self._broken) from None
        if status == _ERR:  # (the server may have closed the connection after it: a later call says so)
            raise PycollError(reply.decode(errors="replace"))
        return status, reply

    @staticmethod
    def _bytes(value: Union[str, bytes]) -> bytes:
        return value.encode() if isinstance(value, str) else bytes(value)

    def set(self, key: str, value: Union[str, bytes]) -> None:
        self._call(_SET, key, self._bytes(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting until some process sets it."""
        status, value = self._call(_GET, key, str(self.timeout).encode(), self.timeout)
        if status == _TIMEOUT:
            raise TimeoutError(f"store: key {key!r} was not set within {self.timeout:g} s")
        return value

    def add(self, key: str, amount: int) -> int:
        amount = int(amount)
        if not -_INT64 <= amount < _INT64:
            raise PycollError(f"store: add of {amount} at {key!r}: out of the store's 64-bit range")
        return int(self._call(_ADD, key, str(amount).encode())[1])

    def compare_set(self, key: str, expected: Union[str, bytes], desired: Union[str, bytes]) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is unset and ``expected`` is
        empty), atomically; return its value afterwards (c10d's ``compare_set``)."""
        e = self._bytes(expected)
        return self._call(_CAS, key, _LEN.pack(len(e)) + e + self._bytes(desired))[1]

    def check(self, keys: Iterable[str]) -> bool:
        return self._call(_CHECK, "\0".join(keys))[1] == b"1"

    def wait(self, keys: Iterable[str], timeout: Optional[float] = None) -> None:
        keys = list(keys)
        t = self.timeout if timeout is None else (timeout.total_seconds() if hasattr(timeout, "total_seconds")
                                                   else float(timeout))
        status, _ = self._call(_WAIT, "\0".join(keys), str(t).encode(), t)
        if status == _TIMEOUT:
            raise TimeoutError(f"store: keys {keys} were not all set within {t:g} s")

    def delete_key(self, key: str) -> bool:
        return self._call(_DELETE, key)[1] == b"1"

    def local_address(self) -> str:
        """This host's address on the interface that reaches the store's server (what a team
        bootstrapped through this store advertises to its peers); 127.0.0.1 if it is unknown."""
        try:
            return self._sock.getsockname()[0]
        except OSError:
            return "127.0.0.1"

    def close(self) -> None:
        self._sock.close()
        if self._server is not None:
            self._server.close()


def store_get(store: object, key: str) -> bytes:
    """``store.get(key)`` as bytes, for pycoll's store and c10d stores alike."""
    value = store.get(key)  # type: ignore[attr-defined]
    return value if isinstance(value, bytes) else bytes(value)


def barrier(store: object, key: str, size: int, poll: Callable[[], int], timeout: float) -> None:
    """Wait until ``size`` ranks have called this with ``key``, calling ``poll()`` (which returns
    how much work it did) all the while: a barrier through the store during which a transport
    keeps progressing (a peer's UCX flush needs this rank's progress to finish). Raises
    :class:`pycoll.TimeoutError` after ``timeout`` seconds."""
    add = store.add  # type: ignore[attr-defined]
    arrived = add(key, 1)
    now = time.monotonic()
    deadline = now + timeout
    every = 0.001  # between looks at the store (a round trip to its one server), doubling to 20 ms
    while arrived < size:
        look = now + every
        while now < look:
            if not poll():
                time.sleep(0.0002)
            now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"store barrier {key!r}: {arrived} of {size} ranks after {timeout:g} s")
        every = min(2 * every, 0.02)
        arrived = add(key, 0)


def allgather(store: object, prefix: str, rank: int, size: int, value: bytes) -> List[bytes]:
    """Every rank's ``value`` through the store (each rank calls it once per prefix)."""
    store.set(f"{prefix}/{rank}", value)  # type: ignore[attr-defined]
    return [value if r == rank else store_get(store, f"{prefix}/{r}") for r in range(size)]
