"""The shared-memory segment and its collectives: correctness in real processes, a rank killed
mid-collective, corrupted segments."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from pycoll.store import TCPStore
from tests.mpirun import ROOT, run_ranks

native = pytest.importorskip("pycoll.native", reason="the native module is not built")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_shm_collectives_matrix(n):
    run_ranks(n, "tests/mpi/shm_colls.py", "matrix" if n in (2, 3) else "quick", timeout=300)


@pytest.mark.parametrize("n", [3])
def test_same_collectives_without_shm(n):
    run_ranks(n, "tests/mpi/shm_colls.py", "quick", timeout=180, env={"PYCOLL_TLS": "mpi"})


def pycoll_shm_entries():
    return [e for e in os.listdir("/dev/shm") if "pycoll" in e.lower()]


def test_killed_rank_gives_errors_and_leaves_nothing_behind():
    script = textwrap.dedent("""
        import os, signal, sys, time
        import numpy as np
        import pycoll
        from pycoll import Team
        from pycoll.store import TCPStore
        rank, size, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
        team = Team.from_store(TCPStore("127.0.0.1", port, timeout=30), rank, size)
        assert team.shared is not None
        for _ in range(3):
            team.allreduce(np.ones(1000)).wait()
        big = np.ones(16 << 20, np.float32)
        if rank == size - 1:
            req = team.allreduce(big)  # posted, partly done: then the rank dies
            req.test()
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            team.allreduce(big, timeout=20).wait()
            print(f"RANK {rank} NO ERROR", flush=True)
        except pycoll.PycollError as exc:
            print(f"RANK {rank} ERROR {type(exc).__name__}: {exc}", flush=True)
    """)
    before = pycoll_shm_entries()
    size = 3
    server = TCPStore(port=0, is_master=True, timeout=30)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(size), str(server.port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              start_new_session=True) for r in range(size)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=60)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        server.close()
    assert procs[-1].returncode == -signal.SIGKILL
    for r in range(size - 1):
        assert f"RANK {r} ERROR" in outs[r], outs[r]
        assert "has died" in outs[r] or "TimeoutError" in outs[r], outs[r]
    assert pycoll_shm_entries() == before  # segments are memfds: never in /dev/shm


def test_native_header_validation():
    from pycoll.native import ffi, lib

    layout = ffi.new("pc_shm_header_t *")
    total = lib.pycoll_shm_layout(3, 4096, layout)
    buf = bytearray(total)
    base = ffi.from_buffer(buf)
    assert lib.pycoll_shm_init(base, total, layout) == 0
    assert lib.pycoll_shm_check(base, total, 3) == 0
    assert lib.pycoll_shm_check(base, total, 4) == -2  # wrong team size
    assert lib.pycoll_shm_check(base, total - 4096, 3) == -3  # mapping too small
    header = np.frombuffer(buf, np.uint64, count=9)
    for field, value in ((0, 0x1234), (4, 1 << 60), (5, 8), (6, total), (3, 100)):  # magic, offsets, slot
        saved = header[field]
        header[field] = value
        assert lib.pycoll_shm_check(base, total, 3) == -2, field
        header[field] = saved
    assert lib.pycoll_shm_layout(0, 4096, layout) == 0 and lib.pycoll_shm_layout(2, 100, layout) == 0


def two_rank_segments(slot_bytes=4096):
    """Two ShmSegments of one team in this process (ranks in threads)."""
    from pycoll.tl.shm import ShmSegment

    box, lock, barrier = {}, threading.Lock(), threading.Barrier(2)
    rounds = [0, 0]

    def allgather(rank):
        def ag(value):
            k = rounds[rank]
            rounds[rank] += 1
            with lock:
                box[(k, rank)] = value
            barrier.wait()
            return [box[(k, 0)], box[(k, 1)]]
        return ag

    segs = [None, None]

    def make(rank):
        segs[rank] = ShmSegment(rank, 2, allgather(rank), slot_bytes=slot_bytes)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return segs


def test_corrupted_segment_is_an_error_not_a_crash():
    import pycoll
    from pycoll.native import DTYPE_CODES, OP_CODES

    segs = two_rank_segments()
    dst = np.zeros(10, np.float32)
    src = np.ones(10, np.float32)
    st = segs[0].new_state(0, OP_CODES[pycoll.ReduceOp.SUM], DTYPE_CODES[np.dtype(np.float32)])
    segs[0].start(st, src, dst, True)
    # a peer's flag far ahead of anything possible
    ctrl = np.frombuffer(segs[0].mm, np.uint64, count=(4096 + 256 * 2) // 8)
    ctrl[(4096 + 256) // 8] = 1 << 40  # rank 1's arrive flag
    with pytest.raises(pycoll.TransportError, match="impossible value"):
        for _ in range(10):
            segs[0].progress(st, 0.0)
    # a corrupted header: every later call says so
    np.frombuffer(segs[1].mm, np.uint64, count=1)[0] = 0xDEADBEEF
    st1 = segs[1].new_state(0, OP_CODES[pycoll.ReduceOp.SUM], DTYPE_CODES[np.dtype(np.float32)])
    segs[1].start(st1, src, dst, True)
    with pytest.raises(pycoll.TransportError, match="header is not valid"):
        segs[1].progress(st1, 0.0)
    for s in segs:
        s.close()
