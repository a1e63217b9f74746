"""The TCP store and teams bootstrapped from it (TCP transport), in real processes."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pycoll.store import TCPStore
from tests.mpirun import ROOT

WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import pycoll
    from pycoll import ReduceOp, Team
    from pycoll.store import TCPStore
    from tests.colltest import expected, make_input, assert_same

    rank, size, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = TCPStore("127.0.0.1", port, timeout=60)
    team = Team.from_store(store, rank, size)
    assert team.transport.name == ("self" if size == 1 else sys.argv[4])
    for alg in ("rd", "ring", "knomial"):
        for dtype, op in (("float32", ReduceOp.SUM), ("int64", ReduceOp.BXOR), ("bfloat16", ReduceOp.MAX)):
            for count in (0, 1, size + 1, 300_000):
                ins = [make_input(dtype, op, r, count) for r in range(size)]
                got = team.allreduce(ins[rank].copy(), op=op, algorithm=alg).wait()
                assert_same([got], expected(ins, op), f"{alg} {dtype} {count}")
    # tagged, posted in different orders, and a second team on the same store
    team2 = Team.from_store(store, rank, size)
    bufs = {t: np.full(1000 + t, float(rank + t)) for t in range(10)}
    order = np.random.default_rng(rank).permutation(10)
    pycoll.wait_all([team2.allreduce(bufs[t], tag=("t", int(t))) for t in order])
    for t in range(10):
        assert (bufs[t] == sum(r + t for r in range(size))).all()
    print(f"RANK {rank} OK", flush=True)
""")


def test_store_basics():
    server = TCPStore(port=0, is_master=True, timeout=1)
    client = TCPStore("127.0.0.1", server.port, timeout=1)
    client.set("a", b"1")
    assert server.get("a") == b"1"
    assert client.add("n", 2) == 2 and server.add("n", 3) == 5
    assert client.check(["a", "n"]) and not client.check(["a", "zz"])
    client.wait(["a"])
    assert client.delete_key("a") and not client.check(["a"])
    import pycoll

    with pytest.raises(pycoll.TimeoutError, match="'missing'"):
        client.get("missing")
    client.close()
    server.close()


@pytest.mark.parametrize("size,tls", [(1, "tcp"), (2, "tcp"), (3, "tcp"), (3, "shm")])
def test_team_from_store_processes(size, tls):
    server = TCPStore(port=0, is_master=True, timeout=60)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYCOLL_TIMEOUT="60",
               PYCOLL_TLS="shm,tcp" if tls == "shm" else tls)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(size), str(server.port), tls],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              cwd=str(ROOT)) for r in range(size)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.close()
    failed = [r for r, out in enumerate(outs) if f"RANK {r} OK" not in out]
    assert not failed, f"ranks {failed} failed:\n" + "\n".join(outs[r][-3000:] for r in failed)


def test_peer_that_vanishes_gives_an_error_not_a_hang():
    script = textwrap.dedent("""
        import os, sys, numpy as np
        import pycoll
        from pycoll import Team
        from pycoll.store import TCPStore
        rank, port = int(sys.argv[1]), int(sys.argv[2])
        team = Team.from_store(TCPStore("127.0.0.1", port, timeout=30), rank, 2)
        team.allreduce(np.ones(4)).wait()
        if rank == 1:
            os._exit(0)  # vanish
        try:
            team.allreduce(np.ones(1 << 20), timeout=20).wait()
        except pycoll.PycollError as exc:
            print("RANK 0 ERROR", type(exc).__name__, exc, flush=True)
    """)
    server = TCPStore(port=0, is_master=True, timeout=30)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYCOLL_TLS="tcp")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(server.port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(2)]
    try:
        out = procs[0].communicate(timeout=60)[0]
        procs[1].communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.close()
    assert "RANK 0 ERROR TransportError tcp: lost rank 1" in out, out


def test_tcp_rejects_malformed_header():
    import socket

    from pycoll.tl.tcp import TCPTransport

    listener = socket.create_server(("127.0.0.1", 0))
    b = socket.create_connection(listener.getsockname())
    a, _ = listener.accept()
    listener.close()
    t = TCPTransport(0, 2, {1: a})
    req = t.irecv(np.zeros(4, np.uint8), 1, ("p", 0))
    b.sendall(b"\xff" * 32)
    for _ in range(100):
        t.progress()
        if req.error is not None:
            break
    with pytest.raises(Exception, match="malformed header"):
        req.test()
    b.close()
    t.close()
