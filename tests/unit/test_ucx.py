"""The UCX transport in one process, a team of one: the library's info, the tag layout's colliding
keys, too-large messages, unexpected messages. In real processes: tests/procs/test_ucx.py."""

import time

import numpy as np
import pytest

from pycoll.errors import TransportError

ucx = pytest.importorskip("pycoll.tl.ucx")
try:
    ucx.info()
except TransportError as exc:  # pragma: no cover - a build without the UCX binding
    pytest.skip(f"UCX is not available: {exc}", allow_module_level=True)


@pytest.fixture
def self_transport():
    import pycoll
    from pycoll.tl.ucx import UCXTransport
    from pycoll.tl.ucx.transport import context_worker

    ctx = pycoll.Context()
    t = UCXTransport(0, 1, lambda b: [b], ctx)
    yield t
    t.close()
    assert context_worker(ctx) is None


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
    t.watch_arrivals()
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
    arrived = t.take_arrivals()
    assert t.demand_id(("c", 7)) in arrived and t.demand_id(("u", "p2p")) in arrived
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
