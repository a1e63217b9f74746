"""Teams bootstrapped from the TCP store (TCP transport and shared memory) in real processes, and a
peer that vanishes. The store itself: tests/unit/test_store.py."""

import textwrap

import pytest

WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import pycoll
    from pycoll import ReduceOp, Team
    from pycoll.store import TCPStore
    from tests.reference import expected, make_input, assert_same

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


@pytest.mark.parametrize("size,tls", [(1, "tcp"), (2, "tcp"), (3, "tcp"), (3, "shm")])
def test_team_from_store_processes(size, tls, store_ranks):
    env = {"PYCOLL_TIMEOUT": "60", "PYCOLL_TLS": "shm,tcp" if tls == "shm" else tls}
    _, outs = store_ranks(WORKER, size, tls, timeout=120, env=env, store_timeout=60)
    failed = [r for r, out in enumerate(outs) if f"RANK {r} OK" not in out]
    assert not failed, f"ranks {failed} failed:\n" + "\n".join(outs[r][-3000:] for r in failed)


def test_peer_that_vanishes_gives_an_error_not_a_hang(store_ranks):
    script = textwrap.dedent("""
        import os, sys, numpy as np
        import pycoll
        from pycoll import Team
        from pycoll.store import TCPStore
        rank, port = int(sys.argv[1]), int(sys.argv[3])  # argv: rank, size, port
        team = Team.from_store(TCPStore("127.0.0.1", port, timeout=30), rank, 2)
        team.allreduce(np.ones(4)).wait()
        if rank == 1:
            os._exit(0)  # vanish
        try:
            team.allreduce(np.ones(1 << 20), timeout=20).wait()
        except pycoll.PycollError as exc:
            print("RANK 0 ERROR", type(exc).__name__, exc, flush=True)
    """)
    _, outs = store_ranks(script, 2, timeout=60, env={"PYCOLL_TLS": "tcp"})
    out = outs[0]
    assert "RANK 0 ERROR PeerLostError tcp: lost rank 1" in out, out


def test_a_timeout_says_what_each_peer_does_through_the_store(store_ranks):
    """Teams made from a store (TCP here) ask their peers through it when a collective times out:
    rank 0's untagged collective #2 names rank 1 (posted a tagged one instead: it has posted #0-#1
    and waits inside pycoll) and rank 2 (asleep in the program: no answer)."""
    script = textwrap.dedent("""
        import sys, time
        import numpy as np
        import pycoll
        from pycoll import Team
        from pycoll.store import TCPStore
        rank, size, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
        team = Team.from_store(TCPStore("127.0.0.1", port, timeout=30), rank, size)
        x = np.ones(10)
        for _ in range(2):
            team.allreduce(x).wait()
        t0 = time.monotonic()
        try:
            if rank == 0:
                team.allreduce(x, timeout=1.0).wait()
            elif rank == 1:
                team.allreduce(x, tag="grads", timeout=2.5).wait()
            else:
                time.sleep(3.0)
        except pycoll.TimeoutError as exc:
            print(f"RANK {rank} TIMEOUT after {time.monotonic() - t0:.2f} s: {exc}", flush=True)
        time.sleep(max(0.0, 3.5 - (time.monotonic() - t0)))  # (no rank leaves while a peer waits)
        print(f"RANK {rank} DONE", flush=True)
    """)
    codes, outs = store_ranks(script, 3, timeout=60, env={"PYCOLL_TLS": "tcp"})
    assert codes == [0, 0, 0], outs
    zero, one = outs[0], outs[1]
    want = "collective #2 of this team: rank 1 has not posted it (posted #0-#1 of this team; waits on: "
    assert want in zero, zero
    assert "rank 2 did not answer within 0.5 s" in zero, zero
    assert "collective use 0 of tag 'grads' of this team: ranks 0, 2 did not answer" in one, one
    took = float(zero.split("TIMEOUT after ")[1].split(" s")[0])
    assert took < 2.5, zero  # 1 s, then half a second of questions
