"""No stranger gets in, in one process: nothing received is unpickled or evaluated (the package is
read for such calls), entries and hellos that fail the job key's MAC are refused, the store bounds
what a client can make it do (its framing fuzzed with hypothesis), the TCP mesh listens where it
advertises and reads hellos it can trust, and pycoll's shared memory is 0600. Attacks on running
jobs: tests/procs/test_security.py; the threat model: docs/guide/security.md."""

import ast
import os
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pycoll
from pycoll.store import TCPStore

PACKAGE = Path(pycoll.__file__).parent
#: mpi4py's lowercase communication calls: they pickle what they send and unpickle what they get.
MPI_PICKLING = {"send", "recv", "isend", "irecv", "bcast", "gather", "scatter", "allgather", "alltoall",
                "reduce", "allreduce", "scan", "exscan", "sendrecv", "ibcast", "igather", "iallgather",
                "mrecv", "imrecv", "sendrecv_replace"}
UNPICKLERS = ("pickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle")
#: Calls that look like running code from outside and are not, each with its reason.
ALLOWED = {
    ("team.py", "exec"): "the methods made from the team's own template text and the table's names",
    ("mpi.py", "exec"): "the mpi4py look-alike's methods made from its own template text",
    ("sim/programs.py", "receive.recv"): "a pipe from a child this process forked: its own recordings",
}


def _calls(tree: ast.AST):
    """(what, line) of every call that runs code or unpickles: eval/exec/compile, pickle and marshal
    (and the modules themselves), and mpi4py's lowercase calls on what looks like a communicator or
    a received message (a name ending in comm/dup, COMM_WORLD, msg) or a Connection's recv()."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name and name.split(".")[0] in UNPICKLERS:
                    yield f"import {name}", node.lineno
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("eval", "exec", "compile", "__import__"):
            yield f.id, node.lineno
        if isinstance(f, ast.Attribute):
            owner = ast.unparse(f.value)
            last = owner.split(".")[-1].lower()
            if f.attr in ("loads", "load", "Unpickler") and last in UNPICKLERS:
                yield f"{owner}.{f.attr}", node.lineno
            elif f.attr in MPI_PICKLING and (last.endswith(("comm", "dup")) or last in ("comm_world", "msg")):
                yield f"{owner}.{f.attr}", node.lineno
            elif f.attr == "recv" and not node.args and not node.keywords:  # (a socket's recv takes a size)
                yield f"{owner}.{f.attr}", node.lineno


def test_nothing_received_is_unpickled_or_evaluated():
    """The package holds no pickle, marshal, eval, exec or mpi4py lowercase call but the allowed
    ones (reasons in ALLOWED): whatever comes from a socket, the store, a peer or a file another
    process wrote is parsed from fixed layouts or JSON."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for what, line in _calls(ast.parse(path.read_text(), str(path))):
            if (rel, what) not in ALLOWED:
                found.append(f"{rel}:{line}: {what}")
    assert not found, "calls that may run code from outside the process:\n" + "\n".join(found)
    for rel, what in ALLOWED:  # (the allowed ones are still there: a stale entry hides nothing)
        assert any(w == what for w, _ in _calls(ast.parse((PACKAGE / rel).read_text()))), (rel, what)


# ---------------------------------------------------------------------- MACs
def test_an_entry_of_another_team_name_rank_or_key_is_refused():
    from pycoll import auth

    seal = auth.Seal.fresh(b"k" * 32)
    blob = seal.sign("pycoll/team1/addr0", 1, b"127.0.0.1:5000")
    assert seal.verify("pycoll/team1/addr0", blob, 2, rank=1) == (1, b"127.0.0.1:5000")
    other_team = auth.Seal(seal.key, os.urandom(auth.ID_BYTES))
    stranger = auth.Seal(os.urandom(32), seal.team_id)  # the team's id, not its key
    for check in (lambda: other_team.verify("pycoll/team1/addr0", blob, 2),
                  lambda: stranger.verify("pycoll/team1/addr0", blob, 2),
                  lambda: seal.verify("pycoll/team1/addr1", blob, 2),  # (replayed in another round)
                  lambda: seal.verify("pycoll/team1/addr0", blob, 2, rank=0),  # (as another rank's)
                  lambda: seal.verify("pycoll/team1/addr0", blob[:-1] + b"1", 2),  # (tampered)
                  lambda: seal.verify("pycoll/team1/addr0", blob[:5], 2),
                  lambda: seal.verify("pycoll/team1/addr0", auth.SIGNED.pack(7, bytes(16)), 2)):
        with pytest.raises(pycoll.errors.AuthError, match="refused"):
            check()


def test_a_keyed_team_keeps_its_entries_under_names_only_the_key_makes():
    from pycoll import auth

    key = auth.new_key().encode()
    where = auth.space(key, "pycoll/team1")
    assert where.startswith("pycoll/team1/") and len(where) > len("pycoll/team1/") + 16
    assert where == auth.space(key, "pycoll/team1") != auth.space(os.urandom(32), "pycoll/team1")
    assert auth.space(b"", "pycoll/team1") == "pycoll/team1"  # (no key: the team is as safe as its store)


def test_the_job_key_is_checked_and_never_shown(monkeypatch):
    from pycoll import auth, config

    monkeypatch.setenv("PYCOLL_JOB_KEY", "short")
    with pytest.raises(pycoll.ConfigError, match="at least 16"):
        auth.job_key()
    secret = auth.new_key()
    monkeypatch.setenv("PYCOLL_JOB_KEY", secret)
    assert auth.job_key() == secret.encode()
    shown = {name: value for name, value, _ in config.describe()}
    assert shown["PYCOLL_JOB_KEY"] == "(set: not shown)" and all(secret not in v for v in shown.values())


def test_status_and_control_messages_are_json_read_field_by_field():
    from pycoll.ps.server import control_message, parse_control
    from pycoll.status import answer_bytes, question_bytes, read_answer, read_question

    assert read_question(question_bytes(5, ("u", ("grads", 3, 1.5), 2))) == (5, ("u", ("grads", 3, 1.5), 2))
    answer = {"posted": True, "count": 4, "waits_on": ["allreduce: recv of 8 B from rank 1"],
              "mark": "ab" * 32}
    assert read_answer(answer_bytes(9, answer)) == (9, {**answer, "mark": bytes.fromhex("ab" * 32)})
    with pytest.raises(ValueError):  # (a mark is 32 bytes of hex, or nothing)
        read_answer(answer_bytes(9, {**answer, "mark": "zz" * 32}))
    for bad in (b"\x80\x04K\x01.", b"[" * 3000, b'{"nonce": 1, "key": ["c", -1]}', b'{"nonce": 1}',
                b'{"nonce": 1, "key": ["u", {"a": 1}, 0]}', b"x" * 5000):
        with pytest.raises(ValueError):
            read_question(bad)
    with pytest.raises(ValueError):
        read_answer(b'{"nonce": 1, "posted": 1, "count": 0, "waits_on": [], "mark": ""}')
    import pickle

    buf = control_message(kind="bye", worker=1)
    assert parse_control(buf) == {"kind": "bye", "worker": 1}
    body = pickle.dumps({"kind": "bye", "worker": 1})
    buf[:4] = np.frombuffer(len(body).to_bytes(4, "little"), np.uint8)
    buf[4:4 + len(body)] = np.frombuffer(body, np.uint8)
    with pytest.raises(pycoll.PycollError, match="not JSON"):
        parse_control(buf)


# ---------------------------------------------------------------------- the store's limits
def _raw(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def _request(op, key, value, klen=None, vlen=None):
    k = key.encode() if isinstance(key, str) else key
    return (struct.pack("<BI", op, len(k) if klen is None else klen) + k
            + struct.pack("<Q", len(value) if vlen is None else vlen) + value)


def _reply(s):
    head = b""
    while len(head) < 9:
        chunk = s.recv(9 - len(head))
        if not chunk:
            return None  # closed
        head += chunk
    status, n = struct.unpack("<BQ", head)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return status, body


def _closed(s):
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def store():
    server = TCPStore(port=0, is_master=True, timeout=5, max_connections=8, max_stored=1 << 20,
                      request_timeout=0.5)
    yield server
    server.close()


def test_a_length_prefix_past_the_limits_is_answered_and_closed_without_reading_it(store):
    """A stranger's 1 GiB value length (then nothing): an error answer at once, the connection
    closed, nothing allocated; a huge key length too. An honest client is told before it sends."""
    for head in (_request(0, "k", b"", vlen=1 << 30), _request(0, b"", b"", klen=1 << 31)[:5]):
        s = _raw(store.port)
        s.sendall(head)
        status, why = _reply(s)
        assert status == 2 and b"at most" in why, why
        assert _closed(s)
        s.close()
    with pytest.raises(pycoll.PycollError, match="at most 262144 B"):
        store.set("big", b"x" * ((256 << 10) + 1))
    with pytest.raises(pycoll.PycollError, match="key longer"):
        store.set("k" * 5000, b"x")
    store.set("after", b"1")  # (the client's connection is still good)
    assert store.get("after") == b"1"


def test_half_a_request_is_closed_after_the_request_timeout_and_blocks_no_one(store):
    s = _raw(store.port)
    s.sendall(_request(0, "slow", b"value")[:7])  # (the op, the key's length, part of the key)
    client = TCPStore("127.0.0.1", store.port, timeout=5)
    client.set("meanwhile", b"1")  # (served while the stranger's request hangs)
    assert _reply(s)[0] == 2 and _closed(s)  # (answered, then closed: its time ran out)
    s.close()
    assert client.get("meanwhile") == b"1"
    client.close()


def test_too_many_connections_are_refused_with_an_answer(store):
    held = [_raw(store.port) for _ in range(7)]  # (the store's own client is the 8th)
    time.sleep(0.2)  # (their threads started: not a timed assertion, a pause for the accepts)
    late = TCPStore("127.0.0.1", store.port, timeout=5)
    with pytest.raises(pycoll.PycollError, match="too many connections"):
        late.set("k", b"v")
    late.close()
    for s in held:
        s.close()
    deadline = time.monotonic() + 10
    while True:  # (the server sees the closes)
        try:
            again = TCPStore("127.0.0.1", store.port, timeout=5)
            again.set("k", b"v")
            break
        except pycoll.PycollError:
            again.close()
            assert time.monotonic() < deadline, "the store never took a connection again"
            time.sleep(0.05)
    again.close()


def test_malformed_requests_get_an_error_and_the_connection_goes_on(store):
    s = _raw(store.port)
    for req, said in ((_request(2, "n", b"not a number"), b"not an integer"),
                      (_request(2, "n", b"9" * 30), b"64-bit"),
                      (_request(99, "k", b""), b"unknown request"),
                      (_request(0, b"\xff\xfe", b"v"), b"UTF-8"),
                      (_request(1, "k", b"soon"), b"timeout"),
                      (_request(6, "k", b"\x01"), b"compare_set")):
        s.sendall(req)
        status, why = _reply(s)
        assert status == 2 and said in why, (req, why)
    s.sendall(_request(2, "n", b"3"))
    assert _reply(s) == (0, b"3")  # (the same connection, still served)
    s.close()
    client = TCPStore("127.0.0.1", store.port, timeout=5)
    with pytest.raises(pycoll.PycollError, match="not an integer"):
        client._call(2, "n2", b"x")
    with pytest.raises(pycoll.PycollError, match="full"):
        for i in range(8):
            client.set(f"fill{i}", b"x" * 200_000)
    client.delete_key("fill0")
    client.set("fits", b"x")
    client.close()


_requests = st.builds(_request, st.integers(0, 255), st.binary(max_size=40), st.binary(max_size=64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=st.lists(st.one_of(_requests, st.binary(max_size=64)), max_size=6))
def test_fuzzed_framing_never_leaves_a_connection_hanging_or_the_store_dead(store, stream):
    """Any bytes a client sends: each complete request is answered (ok, timeout or error); a stream
    that ends in a partial request is answered and closed within the request timeout; the store
    serves an honest client afterwards."""
    s = _raw(store.port)
    s.settimeout(10)
    try:
        try:
            s.sendall(b"".join(stream))
            s.shutdown(socket.SHUT_WR)
        except OSError:  # (the store closed it already: a length past its limits)
            pass
        while True:
            try:
                got = _reply(s)
            except TimeoutError:
                pytest.fail("the store left the connection hanging")
            except ConnectionResetError:
                break
            if got is None:
                break
            assert got[0] in (0, 1, 2)
    finally:
        s.close()
    client = TCPStore("127.0.0.1", store.port, timeout=5)
    client.set("alive", b"1")
    assert client.get("alive") == b"1"
    client.close()


# ---------------------------------------------------------------------- the TCP mesh's listener and hellos
class _Exchange:
    """An allgather of two threads (a real store's job, in memory)."""

    def __init__(self, size=2):
        self.values, self.cond, self.size = {}, threading.Condition(), size

    def of(self, rank):
        def exchange(value):
            with self.cond:
                self.values[rank] = value
                self.cond.notify_all()
                self.cond.wait_for(lambda: len(self.values) == self.size, 10)
                return [self.values[r] for r in range(self.size)]
        return exchange


def _mesh(seal, before_rank1=lambda addrs: None, size=2):
    """Connect a mesh of ``size`` threads; ``before_rank1(rank 0's (host, port))`` runs once rank
    0 listens and before rank 1 connects. Returns every rank's sockets."""
    from pycoll.tl.tcp import connect_mesh

    ex, out, errors = _Exchange(size), {}, []
    seen = threading.Event()

    def rank(r):
        exchange = inner = ex.of(r)
        if r == 1:
            def exchange(value):  # noqa: E306
                got = inner(value)
                host, port = got[0].decode().rsplit(":", 1)
                before_rank1((host, int(port)))
                seen.set()
                return got
        try:
            out[r] = connect_mesh(r, size, exchange, seal, advertise="127.0.0.1", timeout=20)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return out


def test_the_mesh_listens_only_where_it_advertises_and_drops_strangers_hellos():
    """Rank 0 listens on 127.0.0.1 (not 0.0.0.0: 127.0.0.2 reaches nothing); before rank 1
    connects, strangers connect: one says nothing, one says half a hello, one a hello of the
    right team id and rank with a forged MAC, one a hello of another team: all dropped, and the
    mesh joins ranks 0 and 1."""
    from pycoll import auth

    seal = auth.Seal.fresh()
    strangers = []

    def attack(addr):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", addr[1]), timeout=5)
        from pycoll.tl.tcp.transport import _HELLO, _MAGIC, hello

        forged = _HELLO.pack(_MAGIC, 1, seal.team_id, os.urandom(16))
        for said in (b"", hello(auth.Seal.fresh(), 1, 0)[:20], forged, hello(auth.Seal.fresh(), 1, 0)):
            s = socket.create_connection(addr, timeout=5)
            s.sendall(said)
            strangers.append(s)

    socks = _mesh(seal, attack)
    a, b = socks[0][1], socks[1][0]
    a.sendall(b"ping")
    assert b.recv(4) == b"ping"
    for s in strangers:  # (dropped: closed by rank 0, whatever they said)
        assert _closed(s)
        s.close()
    for r in socks.values():
        for s in r.values():
            s.close()


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=0, max_size=80), rank=st.integers(0, 3))
def test_a_fuzzed_hello_is_never_taken(data, rank):
    from pycoll import auth
    from pycoll.tl.tcp.transport import hello, read_hello

    seal = auth.Seal.fresh()
    assert read_hello(data, seal, rank, 4) is None
    good = hello(seal, 3, rank)
    assert read_hello(good, seal, rank, 4) == (3 if rank < 3 else None)
    if data and len(data) <= len(good):
        flipped = bytearray(good)
        flipped[len(data) - 1] ^= data[-1] or 1
        assert read_hello(bytes(flipped), seal, rank, 4) is None


@settings(max_examples=40, deadline=None)
@given(junk=st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=5))
def test_fuzzed_bytes_on_a_tcp_connection_fail_it_with_a_transport_error(junk):
    """Whatever a peer's socket carries, the TCP transport reads it as headers it validates: the
    receive posted on it completes or fails with a TransportError, never anything else."""
    from pycoll.tl.tcp import TCPTransport

    listener = socket.create_server(("127.0.0.1", 0))
    b = socket.create_connection(listener.getsockname())
    a, _ = listener.accept()
    listener.close()
    t = TCPTransport(0, 2, {1: a})
    req = t.irecv(np.zeros(64, np.uint8), 1, ("p", 0))
    b.sendall(b"".join(junk))
    b.close()
    for _ in range(50):
        t.progress()
        if req.done or req.error is not None:
            break
    try:
        req.test()
    except pycoll.TransportError:
        pass
    t.close()


# ---------------------------------------------------------------------- shared memory
def test_team_alloc_memory_is_the_users_alone(monkeypatch):
    """team.alloc's memfd is 0600 before it grows and before any other process may open it (a
    memfd is made 0777)."""
    from pycoll.tl.shm import mapped

    modes = []
    truncate = os.ftruncate

    def spy(fd, length):
        modes.append(os.fstat(fd).st_mode & 0o777)
        return truncate(fd, length)

    monkeypatch.setattr(os, "ftruncate", spy)
    arr, _ = mapped.allocate(0, 1, 16, np.dtype(np.float32), lambda v: [v])
    assert modes == [0o600], [oct(m) for m in modes]
    del arr
