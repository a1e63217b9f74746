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


@pytest.mark.parametrize("n", [2, 3, 4])
def test_shm_reduce_allgather_reduce_scatter(n):
    """reduce (every root), allgather(v), reduce_scatter(v) on small slots: many chunks, unequal
    and empty blocks, in place, mixed with the other segment collectives."""
    run_ranks(n, "tests/mpi/shm_colls.py", "blocks", timeout=180)


@pytest.mark.parametrize("n", [2, 4])
def test_shm_block_collectives_default_slot(n):
    run_ranks(n, "tests/mpi/shm_colls.py", "blocks-default-slot", timeout=180)


def run_store_ranks(script, size, *args, timeout=60):
    """Run ``script`` (python -c) as ``size`` ranks of a TCPStore team; (return codes, outputs)."""
    server = TCPStore(port=0, is_master=True, timeout=30)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(size), str(server.port), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              start_new_session=True) for r in range(size)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        server.close()
    return [p.returncode for p in procs], outs


@pytest.mark.parametrize("coll", ["reduce", "allgather", "reduce_scatter"])
def test_rank_exiting_mid_block_collective_is_an_error(coll):
    script = textwrap.dedent("""
        import os, sys, time
        import numpy as np
        import pycoll
        from pycoll import Team
        from pycoll.store import TCPStore
        rank, size, port, coll = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        team = Team.from_store(TCPStore("127.0.0.1", port, timeout=30), rank, size)
        assert team.shared is not None
        m = 4 << 20  # elements per block: several chunks
        def post(timeout=None):
            if coll == "reduce":
                return team.reduce(np.ones(m, np.float32), np.zeros(m, np.float32), root=0,
                                   algorithm="shm", timeout=timeout)
            if coll == "allgather":
                return team.allgather(np.ones(m, np.float32), np.zeros(size * m, np.float32),
                                      algorithm="shm", timeout=timeout)
            return team.reduce_scatter(np.ones(size * m, np.float32), np.zeros(m, np.float32),
                                       algorithm="shm", timeout=timeout)
        team.barrier().wait()
        if rank == size - 1:
            req = post()  # posted, its first chunk in the segment: then the rank exits
            req.test()
            os._exit(3)
        t0 = time.monotonic()
        try:
            post(timeout=20).wait()
            print(f"RANK {rank} NO ERROR", flush=True)
        except pycoll.PycollError as exc:
            print(f"RANK {rank} ERROR {type(exc).__name__} after {time.monotonic() - t0:.1f} s: {exc}",
                  flush=True)
        try:  # the segment is unusable now: later collectives on it fail at once
            team.allreduce(np.ones(10), algorithm="shm", timeout=20).wait()
            print(f"RANK {rank} LATER NO ERROR", flush=True)
        except pycoll.PycollError as exc:
            print(f"RANK {rank} LATER ERROR {exc}", flush=True)
    """)
    size = 3
    codes, outs = run_store_ranks(script, size, coll)
    assert codes[-1] == 3, outs[-1]
    for r in range(size - 1):
        assert f"RANK {r} ERROR" in outs[r], outs[r]
        assert "has died" in outs[r], outs[r]  # the dead peer is named (exited: no timeout needed)
        assert f"RANK {r} LATER ERROR" in outs[r], outs[r]


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


def test_block_collective_layouts_are_checked():
    """allgather(v)/reduce_scatter(v) layouts: a bad one is a ValueError before the collective takes
    its place on the segment (Python), and an error code, never an access, in native code."""
    import pycoll
    from pycoll.algorithms import get
    from pycoll.algorithms.base import CollArgs
    from pycoll.native import DTYPE_CODES, ffi, lib
    from pycoll.tl.shm.segment import COLL_ALLGATHER, COLL_REDUCE_SCATTER

    segs = two_rank_segments()
    seg = segs[0]
    dst = np.zeros(10, np.float32)
    for coll, src, layout in (("allgatherv", np.ones(4, np.float32), [(0, 4), (4, 7)]),  # past the end
                              ("allgatherv", np.ones(4, np.float32), [(0, 3), (3, 3)]),  # not my size
                              ("reduce_scatterv", np.ones(10, np.float32), [(0, 5)])):  # one block
        a, b = (src, dst) if coll == "allgatherv" else (dst, src[:5])
        args = CollArgs(coll, 0, 2, None, a, b, pycoll.ReduceOp.SUM, layout=layout, shared=seg, name=coll)
        before = seg.tickets
        with pytest.raises(ValueError, match="layout"):
            get(coll, "shm")(args)
        assert seg.tickets == before
    f32 = DTYPE_CODES[np.dtype(np.float32)]
    for kind, count, src_count, lay in ((COLL_ALLGATHER, 10, 4, [0, 4, 8, 4]),  # block 1 past dst
                                        (COLL_ALLGATHER, 10, 4, [0, 3, 4, 4]),  # block 0 is not src
                                        (COLL_REDUCE_SCATTER, 5, 10, [0, 5, 2**63, 5]),  # overflow
                                        (COLL_REDUCE_SCATTER, 5, 10, None)):  # no layout
        st = seg.new_state(kind, 0, f32)
        keep = np.array(lay or [0], np.uint64)
        st.layout = ffi.cast("const uint64_t *", ffi.from_buffer(keep)) if lay else ffi.NULL
        src = np.zeros(src_count, np.float32)
        src_c, dst_c = ffi.from_buffer(src), ffi.from_buffer(dst)  # alive until the call returns
        st.src, st.dst = ffi.cast("const char *", src_c), ffi.cast("char *", dst_c)
        st.count, st.src_count, st.gen = count, src_count, seg.next_gen
        st.nchunks = lib.pycoll_shm_chunks(st)
        assert lib.pycoll_shm_progress(st, 10) in (-1, -3), (kind, lay)
    for s in segs:
        s.close()
