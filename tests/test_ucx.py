"""The UCX transport (PYCOLL_TLS=ucx): every collective in real processes on 1-8 ranks (teams from
MPI and from a store sharing one worker, both loading orders against mpi4py, UCX_TLS=tcp), the
tag layout's collisions, too-large messages, a missing library and a dying rank."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from pycoll.errors import TransportError
from tests.mpirun import ROOT, run_ranks

ucx = pytest.importorskip("pycoll.tl.ucx")
try:
    ucx.info()
except TransportError as exc:  # pragma: no cover - a build without the UCX binding
    pytest.skip(f"UCX is not available: {exc}", allow_module_level=True)


@pytest.mark.parametrize("n,order,env", [
    (1, "mpi-first", {}),
    (2, "mpi-first", {"UCX_TLS": "tcp"}),
    (3, "ucx-first", {}),
    (4, "mpi-first", {}),
    (5, "ucx-first", {}),
    (6, "mpi-first", {}),
    (7, "ucx-first", {}),
    (8, "ucx-first", {}),
])
def test_collectives_over_ucx(n, order, env):
    run_ranks(n, "tests/mpi/ucx_colls.py", order, timeout=240, env={"PYCOLL_TLS": "ucx", **env})


# ------------------------------------------------------------------ one process, a team of one
@pytest.fixture
def self_transport():
    import pycoll
    from pycoll.tl.ucx import UCXTransport

    ctx = pycoll.Context()
    t = UCXTransport(0, 1, lambda b: [b], ctx)
    yield t
    t.close()
    assert getattr(ctx, "_ucx_worker", None) is None


def _wait(t, req, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not req.test():
        t.progress()
        assert time.monotonic() < deadline, f"{req} did not finish"


def test_info():
    i = ucx.info()
    assert i["version"].count(".") == 2 and i["transports"], i
    assert any(t.startswith("self/") for t in i["transports"]), i["transports"]


def test_colliding_checked_keys_are_told_apart(self_transport):
    """Two user tags whose hashes agree in the 20 bits the tag keeps: the header routes each
    message to its own receive, whatever the order of posts."""
    from pycoll.tl.base import key_hash
    from pycoll.tl.ucx.transport import _KEY_MASK

    seen = {}
    for i in range(1 << 16):
        h = key_hash(("u", i)) & _KEY_MASK
        if h in seen:
            a, b = ("u", seen[h], 0), ("u", i, 0)
            break
        seen[h] = i
    t = self_transport
    for size in (10, 1 << 20):  # eager and rendezvous
        xa, xb = np.full(size, 1, np.uint8), np.full(size, 2, np.uint8)
        sa, sb = t.isend(xa, 0, a), t.isend(xb, 0, b)
        ya, yb = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
        rb, ra = t.irecv(yb, 0, b), t.irecv(ya, 0, a)
        for r in (sa, sb, ra, rb):
            _wait(t, r)
        assert (ya == 1).all() and (yb == 2).all()
        t.poll_unexpected()
        assert not t._kstash and not t._waiting


def test_too_large_is_a_transport_error(self_transport):
    t = self_transport
    for key in (("u", "big", 0), ("c", 12345, 0)):  # checked (header) and untagged (UCP truncation)
        for size in (100, 1 << 20):
            s = t.isend(np.ones(size, np.uint8), 0, key)
            r = t.irecv(np.zeros(size // 2, np.uint8), 0, key)
            with pytest.raises(TransportError, match="larger than the receive buffer"):
                _wait(t, r)
            try:
                _wait(t, s)
            except TransportError:
                pass


def test_unexpected_messages_complete_sends_and_are_counted(self_transport):
    """A rendezvous send completes once the engine polls for unexpected messages (the transport
    contract), and its collective's demand id is listed; probe and cancel work."""
    t = self_transport
    t.arrivals = []
    big = np.arange(1 << 21, dtype=np.uint8)
    s1 = t.isend(big, 0, ("c", 7, 3))
    s2 = t.isend(big, 0, ("u", "p2p", 1))
    for _ in range(2000):
        t.poll_unexpected()
        t.progress()
        if s1.test() and s2.test() and t.has_unexpected(("c", 7)) and t.has_unexpected(("u", "p2p")):
            break
        time.sleep(0.001)
    assert s1.test() and s2.test()
    assert t.has_unexpected(("c", 7)) and t.has_unexpected(("u", "p2p"))
    assert t.demand_id(("c", 7)) in t.arrivals and t.demand_id(("u", "p2p")) in t.arrivals
    assert t.probe(0, ("c", 7, 3)) and t.probe(0, ("u", "p2p", 1)) and not t.probe(0, ("u", "p2p", 2))
    out1, out2 = np.zeros_like(big), np.zeros_like(big)
    r1, r2 = t.irecv(out1, 0, ("c", 7, 3)), t.irecv(out2, 0, ("u", "p2p", 1))
    _wait(t, r1)
    _wait(t, r2)
    assert (out1 == big).all() and (out2 == big).all() and r1.nbytes == big.nbytes
    assert not t.has_unexpected(("c", 7)) and not t.has_unexpected(("u", "p2p"))
    # cancel: a posted receive withdrawn, for both paths
    for key in (("c", 8, 0), ("u", "never", 0)):
        r = t.irecv(np.zeros(8, np.uint8), 0, key)
        t.progress()
        r.cancel()
        for _ in range(100):
            t.progress()
        assert not r.done


# ------------------------------------------------------------------ failures
def _python(code, env=None, timeout=60):
    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=timeout)


def test_missing_library_is_a_transport_error():
    code = """
        import pycoll
        from pycoll.errors import TransportError
        from pycoll.tl.ucx import UCXTransport, info
        for make in (info, lambda: UCXTransport(0, 2, lambda b: [b, b], pycoll.Context())):
            try:
                make()
            except TransportError as exc:
                assert "cannot load libucp" in str(exc) and "nowhere" in str(exc), exc
            else:
                raise AssertionError("no error")
        print("OK")
    """
    res = _python(code, env={"PYCOLL_UCX_LIB": "/nowhere/libucp.so.0"})
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("peer_errors", ["auto", "1"])
def test_dying_rank_is_an_error_not_a_hang(peer_errors):
    """auto (same node: no peer error mode, so shared memory): the collective's timeout; 1: UCP's
    peer error mode (TCP between local ranks) may report the loss first. Either way a pycoll
    error in time."""
    from pycoll.store import TCPStore

    script = textwrap.dedent("""
        import os, sys, time
        import numpy as np
        import pycoll
        from pycoll import Team
        from pycoll.store import TCPStore
        rank, size, port = map(int, sys.argv[1:4])
        store = TCPStore("127.0.0.1", port, timeout=30)
        team = Team.from_store(store, rank, size)
        assert team.transport.name == "ucx", team
        x = np.ones(1 << 16)
        team.allreduce(x).wait()
        if rank == 1:
            # a send complete here may not have reached rank 0 yet: die only once it has
            store.wait(["rank0-done"])
            os._exit(3)
        store.set("rank0-done", "1")
        t0 = time.monotonic()
        try:
            team.allreduce(np.ones(1 << 20), algorithm="ring", timeout=5).wait()
        except pycoll.PycollError as exc:
            print("ERROR", type(exc).__name__, round(time.monotonic() - t0, 1), exc, flush=True)
            os._exit(0)
        print("NO ERROR", flush=True)
    """)
    server = TCPStore(port=0, is_master=True, timeout=30)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYCOLL_TLS="ucx", PYCOLL_UCX_PEER_ERRORS=peer_errors)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), "2", str(server.port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              start_new_session=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        server.close()
    assert procs[1].returncode == 3, outs[1]
    assert procs[0].returncode == 0 and "ERROR" in outs[0], outs[0]
    took = float(outs[0].split("ERROR", 1)[1].split()[1])
    print(outs[0])
    assert took < 15, outs[0]
