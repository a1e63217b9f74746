"""The TCP store and the TCP transport in one process. Teams bootstrapped from the store in real
processes: tests/procs/test_store.py."""

import numpy as np
import pytest

from pycoll.store import TCPStore


def test_a_store_barrier_polls_while_it_waits_and_times_out():
    """store.barrier: the ranks leave once all arrived, each having called its poll() while it
    waited (a UCX close progresses its worker there); a rank that never comes is a TimeoutError."""
    import threading
    import time

    import pycoll
    from pycoll.store import barrier

    server = TCPStore(port=0, is_master=True, timeout=5)
    client = TCPStore("127.0.0.1", server.port, timeout=5)
    polls = [0, 0]

    def poll(i):
        polls[i] += 1
        return 0

    late = threading.Thread(target=lambda: (time.sleep(0.2), barrier(client, "b", 2, lambda: poll(1), 5)))
    late.start()
    t0 = time.monotonic()
    barrier(server, "b", 2, lambda: poll(0), 5)
    late.join()
    assert time.monotonic() - t0 >= 0.19 and polls[0] > 10, polls
    with pytest.raises(pycoll.TimeoutError, match="1 of 2 ranks"):
        barrier(server, "never", 2, lambda: 0, 0.1)
    client.close()
    server.close()


def test_store_basics():
    server = TCPStore(port=0, is_master=True, timeout=1)
    client = TCPStore("127.0.0.1", server.port, timeout=1)
    client.set("a", b"1")
    assert server.get("a") == b"1"
    assert client.add("n", 2) == 2 and server.add("n", 3) == 5
    assert client.check(["a", "n"]) and not client.check(["a", "zz"])
    client.wait(["a"])
    # compare_set as c10d's: set if unset (expected empty) or equal; the value afterwards
    assert client.compare_set("c", "", "x") == b"x" and server.compare_set("c", "", "y") == b"x"
    assert client.compare_set("c", "x", "z") == b"z" and client.compare_set("d", "q", "r") == b"q"
    assert not client.check(["d"])
    assert client.delete_key("a") and not client.check(["a"])
    import pycoll

    with pytest.raises(pycoll.TimeoutError, match="'missing'"):
        client.get("missing")
    client.close()
    server.close()


def test_tcp_rejects_malformed_header():
    import socket

    from pycoll.tl.tcp import TCPTransport

    listener = socket.create_server(("127.0.0.1", 0))
    b = socket.create_connection(listener.getsockname())
    a, _ = listener.accept()
    listener.close()
    t = TCPTransport(0, 2, {1: a})
    req = t.irecv(np.zeros(4, np.uint8), 1, ("p", 0))
    from pycoll.tl.tcp import transport

    b.sendall(b"\xff" * transport._HEADER.size)
    for _ in range(100):
        t.progress()
        if req.error is not None:
            break
    with pytest.raises(Exception, match="malformed header"):
        req.test()
    b.close()
    t.close()


def test_a_bootstrap_that_fails_leaves_no_transport_registered_or_open(monkeypatch):
    """A store-made team whose bootstrap fails after its transport was made (here: the segment's
    step raises on both ranks, as a peer lost in a shrink's bootstrap would make it) closes that
    transport and takes it out of the engine before the error reaches the caller."""
    import threading

    from pycoll import bootstrap, get_context
    from pycoll.team import Team

    def broken(team, allgather, tls=None, live=None):
        raise RuntimeError("the bootstrap broke")

    class OneTeamNumber(dict):  # (both threads' teams are one team: the same store keys)
        def get(self, key, default=None):
            return 0

    monkeypatch.setattr(bootstrap, "attach_shm", broken)
    monkeypatch.setattr(bootstrap, "_store_teams", OneTeamNumber())
    ctx = get_context()
    before = list(ctx._transports)
    server = TCPStore(port=0, is_master=True, timeout=10)
    errors = []

    def rank(r):
        store = TCPStore("127.0.0.1", server.port, timeout=10)
        try:
            Team.from_store(store, r, 2, ctx, tls=["tcp"])
        except RuntimeError as exc:
            errors.append(str(exc))
        finally:
            store.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    server.close()
    assert errors == ["the bootstrap broke"] * 2
    assert ctx._transports == before


def test_a_store_server_that_stops_answering_is_an_error_not_a_hang():
    """A server that accepts but never answers (its process stuck, say in MPI_Finalize with its
    threads stopped): every call raises within the store's timeout, and later calls at once."""
    import socket
    import threading
    import time

    from pycoll.errors import PycollError
    from pycoll.store import TCPStore

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(srv.accept()), daemon=True).start()
    store = TCPStore("127.0.0.1", srv.getsockname()[1], timeout=0.3)
    for call in (lambda: store.check(["k"]), lambda: store.get("k"), lambda: store.set("k", "v")):
        t0 = time.monotonic()
        with pytest.raises(PycollError, match="did not answer within"):
            call()
        assert time.monotonic() - t0 < 1.5
    store.close()
    srv.close()
    for conn, _ in accepted:
        conn.close()


def test_a_store_whose_process_ends_closes_its_connections_at_once():
    """The process serving the store exits while a client waits on it and stays alive a while
    after its interpreter stopped its threads (as mpi4py's MPI_Finalize keeps a rank that finished
    first): the client's call raises at once that the store is gone, not after its timeout."""
    import subprocess
    import sys
    import textwrap
    import time

    from pycoll.errors import PycollError

    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import atexit, sys, time
        atexit.register(time.sleep, 20)  # (registered first: runs last, after the store's handler)
        from pycoll.store import TCPStore
        server = TCPStore(port=0, is_master=True, timeout=60)
        print(server.port, flush=True)
        sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        store = TCPStore("127.0.0.1", int(child.stdout.readline()), timeout=60)
        store.set("k", "v")
        child.stdin.write("\n")  # (the server's process now ends, slowly)
        child.stdin.flush()
        t0 = time.monotonic()
        with pytest.raises(PycollError, match="was closed"):
            store.get("never set")
        assert time.monotonic() - t0 < 5
        with pytest.raises(PycollError, match="was closed"):  # (and every later call, at once)
            store.check(["k"])
        store.close()
    finally:
        child.kill()
        child.wait()
