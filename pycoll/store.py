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
"""

from __future__ import annotations

import atexit
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
_MAX_KEY = 1 << 16
_MAX_VALUE = 1 << 30
_NO_LIMIT = 1e9  # (seconds: a longer timeout, or inf, waits for ever)


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


class _Server:
    """The store's server: a thread per client; ``get``/``wait`` block on a condition."""

    def __init__(self, host: str, port: int) -> None:
        self.data: Dict[str, bytes] = {}
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
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                op, klen = _REQ.unpack(_recv_exact(conn, _REQ.size))
                if op > _CAS or klen > _MAX_KEY:
                    raise PycollError(f"store: malformed request (op {op}, key length {klen})")
                key = _recv_exact(conn, klen).decode()
                (vlen,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
                if vlen > _MAX_VALUE:
                    raise PycollError(f"store: value of {vlen} B is too large")
                value = _recv_exact(conn, vlen)
                status, reply = self._handle(op, key, value)
                conn.sendall(_REP.pack(status, len(reply)) + reply)
        except (ConnectionError, OSError, PycollError, struct.error, UnicodeDecodeError):
            with self.cond:
                if conn in self.conns:
                    self.conns.remove(conn)
            conn.close()

    def _handle(self, op: int, key: str, value: bytes) -> tuple:
        with self.cond:
            if op == _SET:
                self.data[key] = value
                self.cond.notify_all()
                return _OK, b""
            if op == _ADD:
                n = int(self.data.get(key, b"0")) + int(value)
                self.data[key] = str(n).encode()
                self.cond.notify_all()
                return _OK, str(n).encode()
            if op == _CHECK:
                keys = key.split("\0") if key else []
                return _OK, b"1" if all(k in self.data for k in keys) else b"0"
            if op == _DELETE:
                return _OK, b"1" if self.data.pop(key, None) is not None else b"0"
            if op == _CAS:  # value: u64 length of expected, expected, desired (c10d's compareSet)
                if len(value) < _LEN.size:
                    return _ERR, b"compare_set: malformed request"
                (n,) = _LEN.unpack_from(value)
                if n > len(value) - _LEN.size:
                    return _ERR, b"compare_set: malformed request"
                expected, desired = value[_LEN.size:_LEN.size + n], value[_LEN.size + n:]
                current = self.data.get(key)
                if (current is None and not expected) or (current is not None and current == expected):
                    self.data[key] = current = desired
                    self.cond.notify_all()
                return _OK, expected if current is None else current
            timeout = float(value) if value else None
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
            read it back from ``store.port``).
        is_master: run the server in this process.
        timeout: seconds a ``get``/``wait`` may block before raising :class:`pycoll.TimeoutError`;
            also how long any request waits for the server's answer beyond that before raising
            :class:`pycoll.PycollError` (a server that stopped answering).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, is_master: bool = False,
                 timeout: float = 300.0, connect_timeout: float = 60.0) -> None:
        self.host = host
        self.timeout = timeout
        self._server = _Server(host, port) if is_master else None
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
        limit = wait + self.timeout
        with self._lock:
            if self._broken is not None:
                raise PycollError(self._broken)
            sock = self._sock
            sock.settimeout(limit if limit < _NO_LIMIT else None)
            try:
                sock.sendall(_REQ.pack(op, len(k)) + k + _LEN.pack(len(value)) + value)
                status, n = _REP.unpack(_recv_exact(sock, _REP.size))
                return status, _recv_exact(sock, n)
            except socket.timeout:  # noqa: UP041 - (this module imports pycoll.TimeoutError)
                self._broken = f"store: {self.host}:{self.port} did not answer within {limit:g} s"
                sock.close()
                raise PycollError(self._broken) from None
            except OSError as exc:  # (ConnectionError too: the server closed the connection)
                self._broken = (f"store: the connection to {self.host}:{self.port} was closed ({exc}): "
                                "the process serving the store ended or closed it")
                sock.close()
                raise PycollError(self._broken) from None

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
        return int(self._call(_ADD, key, str(int(amount)).encode())[1])

    def compare_set(self, key: str, expected: Union[str, bytes], desired: Union[str, bytes]) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is unset and ``expected`` is
        empty), atomically; return its value afterwards (c10d's ``compare_set``)."""
        e = self._bytes(expected)
        status, value = self._call(_CAS, key, _LEN.pack(len(e)) + e + self._bytes(desired))
        if status != _OK:
            raise PycollError(f"store: {value.decode(errors='replace')}")
        return value

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
