"""The shared-memory segment in one process: the native header checks, corrupted segments and
block layouts are errors, never a crash or an out-of-bounds access."""

import threading

import numpy as np
import pytest

native = pytest.importorskip("pycoll.native", reason="the native module is not built")
#: Bytes of a rank's control block in the segment (PC_CTRL_BYTES in native/pycoll_native.h).
CTRL_BYTES = native.lib.PC_CTRL_BYTES


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
    ctrl = np.frombuffer(segs[0].mm, np.uint64, count=(4096 + CTRL_BYTES * 2) // 8)
    ctrl[(4096 + CTRL_BYTES) // 8] = 1 << 40  # rank 1's arrive flag
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


def _run(seg, kind, src, dst, layout=None, rlayout=None, root=0, polls=1000):
    """Start a collective of ``kind`` on ``seg`` and progress it once; (state, rc, keep-alive)."""
    from pycoll.native import DTYPE_CODES, ffi, lib

    st = seg.new_state(kind, 0, DTYPE_CODES[np.dtype(np.int32)], root)
    keep = [src, dst]
    for name, lay in (("layout", layout), ("rlayout", rlayout)):
        if lay is None:
            setattr(st, name, ffi.NULL)
        else:
            arr = np.array(lay, np.uint64)
            keep.append(arr)
            setattr(st, name, ffi.cast("const uint64_t *", ffi.from_buffer(arr)))
    st.src_count = src.size
    seg.start(st, src, dst, True)
    keep.append(st)
    return st, lib.pycoll_shm_progress(st, polls), keep


def test_scatter_and_alltoall_headers_are_checked():
    """The sizes a scatter root or an alltoall sender writes before its pieces: a reader whose
    block has another size (ranks that disagree, or a corrupted header) gets an error, never a
    short or a long copy."""
    from pycoll.tl.shm.segment import COLL_ALLTOALL, COLL_SCATTER

    segs = two_rank_segments()
    # scatter: the root writes its slot (header + pieces), then waits for rank 1 to be there (and
    # to have signed the same scatter)
    whole = np.arange(8, dtype=np.int32)
    root_out = np.zeros(4, np.int32)
    st0, rc, keep0 = _run(segs[0], COLL_SCATTER, whole, root_out, layout=[0, 4, 4, 4])
    assert rc == 0 and (root_out == whole[:4]).all()
    out = np.full(4, -1, np.int32)
    slot = np.frombuffer(segs[1].mm, np.uint64, count=2, offset=segs[1].slot_offset(st0.gen - 1, 0, st0))
    assert list(slot) == [4, 4]
    slot[1] = 5  # the header now says rank 1's block has 5 elements
    st1, rc, keep1 = _run(segs[1], COLL_SCATTER, out, out)
    assert rc == -5 and (out == -1).all()
    # alltoall: both write, rank 1's header says 3 elements for rank 0, who expects 2
    for s in segs:
        s.close()
    segs = two_rank_segments()
    src0, dst0 = np.arange(4, dtype=np.int32), np.full(4, -1, np.int32)
    src1, dst1 = np.arange(5, dtype=np.int32) + 10, np.full(4, -1, np.int32)
    st1, rc1, keep1 = _run(segs[1], COLL_ALLTOALL, src1, dst1, layout=[0, 3, 3, 2], rlayout=[0, 2, 2, 2])
    st0, rc0, keep0 = _run(segs[0], COLL_ALLTOALL, src0, dst0, layout=[0, 2, 2, 2], rlayout=[0, 2, 2, 2])
    assert rc0 == -5 and (dst0[2:] == -1).all()
    for s in segs:
        s.close()


def test_single_copy_addresses_and_sizes_are_checked():
    """The single-copy (cma) forms: a reader takes the sender's address and size from the segment;
    a size that is not the one it expects is "disagree", an address that cannot be read is a
    failed read (its own buffer untouched both times), and a sender waits until its readers are
    done."""
    from pycoll.native import lib
    from pycoll.tl.shm.segment import COLL_BCAST_CMA, COLL_SCATTER_CMA

    segs = two_rank_segments()
    data = np.arange(6, dtype=np.int32)
    st0, rc0, keep0 = _run(segs[0], COLL_BCAST_CMA, data, data)
    assert rc0 == 0  # published; waits for the reader
    out = np.full(6, -1, np.int32)
    st1, rc1, keep1 = _run(segs[1], COLL_BCAST_CMA, out, out)
    assert rc1 == 1 and (out == data).all()
    assert lib.pycoll_shm_progress(st0, 1000) == 1
    for s in segs:
        s.close()
    # the root's pair (address, size), corrupted
    segs = two_rank_segments()
    st0, rc0, keep0 = _run(segs[0], COLL_BCAST_CMA, data, data)
    pair = np.frombuffer(segs[1].mm, np.uint64, count=2, offset=segs[1].slot_offset(st0.gen, 0))
    assert pair[1] == 6
    pair[1] = 7
    out = np.full(6, -1, np.int32)
    st1, rc1, keep1 = _run(segs[1], COLL_BCAST_CMA, out, out)
    assert rc1 == -5 and (out == -1).all()
    for s in segs:
        s.close()
    segs = two_rank_segments()
    segs[0].cma_inline = 0  # every block read from the sender's memory
    whole = np.arange(8, dtype=np.int32)
    st0, rc0, keep0 = _run(segs[0], COLL_SCATTER_CMA, whole, np.zeros(4, np.int32), layout=[0, 4, 4, 4])
    assert rc0 == 0
    pairs = np.frombuffer(segs[1].mm, np.uint64, count=4, offset=segs[1].slot_offset(st0.gen, 0))
    assert pairs[3] == 4
    pairs[2] = 8  # rank 1's block now at an address nobody has mapped
    out = np.full(4, -1, np.int32)
    st1, rc1, keep1 = _run(segs[1], COLL_SCATTER_CMA, out, out)
    assert rc1 == -6 and (out == -1).all()
    for s in segs:
        s.close()
    # a small block goes through the sender's slot (the reader copies it out; the sender waits for
    # nobody's reads, only for every rank's signature); an entry that points outside the slot is an
    # impossible value, nothing is copied
    for corrupt in (False, True):
        segs = two_rank_segments()
        st0, rc0, keep0 = _run(segs[0], COLL_SCATTER_CMA, whole, np.zeros(4, np.int32), layout=[0, 4, 4, 4])
        assert rc0 == 0
        pairs = np.frombuffer(segs[1].mm, np.uint64, count=4, offset=segs[1].slot_offset(st0.gen0, 0))
        assert pairs[2] >> 63 == 1 and pairs[3] == 4
        if corrupt:
            pairs[2] = (1 << 63) | (segs[1].slot_bytes - 8)
        out = np.full(4, -1, np.int32)
        st1, rc1, keep1 = _run(segs[1], COLL_SCATTER_CMA, out, out)
        assert (rc1, list(out)) == ((-4, [-1] * 4) if corrupt else (1, [4, 5, 6, 7]))
        for s in segs:
            s.close()


def test_single_copy_allreduce_sums_and_checks_addresses():
    """The single-copy allreduce: each rank reduces its half out of both inputs and writes it into
    both outputs (in place too); a peer's published address that cannot be read or written is a
    failed system call (PC_ECMA), with nothing written into either output."""
    from pycoll.native import lib
    from pycoll.tl.shm.segment import COLL_ALLREDUCE_CMA

    for in_place in (False, True):
        segs = two_rank_segments()
        ins = [np.arange(9, dtype=np.int32), np.full(9, 100, np.int32)]
        outs = ins if in_place else [np.full(9, -1, np.int32), np.full(9, -1, np.int32)]
        st0, rc0, keep0 = _run(segs[0], COLL_ALLREDUCE_CMA, ins[0], outs[0])
        assert rc0 == 0  # its addresses published; rank 1 not there
        st1, rc1, keep1 = _run(segs[1], COLL_ALLREDUCE_CMA, ins[1], outs[1])
        assert rc1 in (0, 1)
        assert lib.pycoll_shm_progress(st0, 1000) == 1 and lib.pycoll_shm_progress(st1, 1000) == 1
        for r in range(2):
            assert (outs[r] == np.arange(9) + 100).all(), (in_place, r, outs[r])
        for s in segs:
            s.close()
    # ranks that disagree on the count: rank 1's bigger buffers are never read or written past
    # rank 0's, nor rank 0's past rank 1's: both see another size before touching anything
    segs = two_rank_segments()
    big, small = np.full(32, -1, np.int32), np.full(32, -1, np.int32)
    st1, rc1, keep1 = _run(segs[1], COLL_ALLREDUCE_CMA, np.arange(16, dtype=np.int32), big[:16])
    st0, rc0, keep0 = _run(segs[0], COLL_ALLREDUCE_CMA, np.arange(8, dtype=np.int32), small[:8])
    assert rc0 in (-5, -7) and lib.pycoll_shm_progress(st1, 1000) in (-5, -7)
    assert (big == -1).all() and (small == -1).all()
    for s in segs:
        s.close()
    for field in (0, 1):  # rank 1's input, then its output, at an address nobody has mapped
        segs = two_rank_segments()
        ins, outs = [np.arange(9, dtype=np.int32)] * 2, [np.full(9, -1, np.int32) for _ in range(2)]
        st1, rc1, keep1 = _run(segs[1], COLL_ALLREDUCE_CMA, ins[1], outs[1])
        assert rc1 == 0
        pairs = np.frombuffer(segs[0].mm, np.uint64, count=5, offset=segs[0].slot_offset(st1.gen, 1))
        assert pairs[field] != 0 and pairs[3] == 9 * 4
        pairs[field] = 8
        st0, rc0, keep0 = _run(segs[0], COLL_ALLREDUCE_CMA, ins[0], outs[0])
        assert rc0 == -6 and (outs[0] == -1).all() and (outs[1] == -1).all()
        for s in segs:
            s.close()


def test_gather_ranks_that_disagree():
    """A gather whose root expects a block size another rank does not send: both ranks say the
    ranks disagree (the root before copying anything, the sender from the flows of the ranks'
    signatures); a root that says there are fewer chunks than a rank needs: that rank says so."""
    from pycoll.tl.shm.segment import COLL_GATHER

    segs = two_rank_segments(slot_bytes=64)  # 16 int32 per chunk
    out = np.full(8, -1, np.int32)
    st0, rc0, keep0 = _run(segs[0], COLL_GATHER, np.arange(4, dtype=np.int32), out, layout=[0, 4, 4, 4])
    assert rc0 == 0  # waits for rank 1
    st1, rc1, keep1 = _run(segs[1], COLL_GATHER, np.arange(3, dtype=np.int32), np.zeros(3, np.int32))
    assert rc1 == -5  # rank 1 wrote its block; the root's flow says it expects another size
    from pycoll.native import lib

    # the root: rank 1's signature says 3 elements, its counts 4: they disagree, nothing copied
    assert lib.pycoll_shm_progress(st0, 1000) == -5 and (out[4:] == -1).all()
    for s in segs:
        s.close()
    segs = two_rank_segments(slot_bytes=64)
    st0, rc0, keep0 = _run(segs[0], COLL_GATHER, np.arange(4, dtype=np.int32), np.zeros(8, np.int32),
                           layout=[0, 4, 4, 4])
    st1, rc1, keep1 = _run(segs[1], COLL_GATHER, np.arange(40, dtype=np.int32), np.zeros(40, np.int32))
    assert rc1 == -5  # it needs 3 chunks, the root says 1
    for s in segs:
        s.close()


def test_inline_small_collectives_check_their_header():
    """Small allreduce/reduce/bcast data travels on the flag's cache line with a header (its size
    and generation): a reader whose count differs gets "disagree", a corrupted header an error,
    never a short, long or stale copy."""
    from pycoll.tl.shm.segment import COLL_ALLREDUCE, COLL_BCAST

    def line(seg, rank):  # rank's arrive line: flag, sleepers, inline bytes, inline generation
        off = 4096 + CTRL_BYTES * rank
        return (np.frombuffer(seg.mm, np.uint32, count=4, offset=off),
                np.frombuffer(seg.mm, np.uint64, count=1, offset=off + 16))

    segs = two_rank_segments()
    # a working pair: both results, the header says 8 bytes of generation 1
    x0, x1 = np.array([1, 2], np.int32), np.array([10, 20], np.int32)
    y0, y1 = np.zeros(2, np.int32), np.zeros(2, np.int32)
    st1, rc1, keep1 = _run(segs[1], COLL_ALLREDUCE, x1, y1)
    assert rc1 == 0  # wrote its data, waits for rank 0
    words, gen = line(segs[1], 1)
    assert words[3] == 8 and gen[0] == 1
    st0, rc0, keep0 = _run(segs[0], COLL_ALLREDUCE, x0, y0)
    assert rc0 == 1 and (y0 == [11, 22]).all()
    from pycoll.native import lib

    assert lib.pycoll_shm_progress(st1, 1000) == 1 and (y1 == [11, 22]).all()
    # ranks that disagree on the count: rank 1 sends 3 elements, rank 0 expects 2
    st1, rc1, keep1 = _run(segs[1], COLL_ALLREDUCE, np.arange(3, dtype=np.int32), np.zeros(3, np.int32))
    out = np.full(2, -1, np.int32)
    st0, rc0, keep0 = _run(segs[0], COLL_ALLREDUCE, x0, out)
    assert rc0 == -7 and (out == -1).all()  # the signatures differ (PC_EMISMATCH)
    for s in segs:
        s.close()
    # a corrupted header: the generation of a bcast root's data is not this collective's
    segs = two_rank_segments()
    data = np.array([7, 8], np.int32)
    st0, rc0, keep0 = _run(segs[0], COLL_BCAST, data, data)
    assert rc0 == 0  # the root wrote its data; it is done once rank 1 is there (signed alike)
    words, gen = line(segs[1], 0)
    gen[0] = 99
    out = np.full(2, -1, np.int32)
    st1, rc1, keep1 = _run(segs[1], COLL_BCAST, out, out)
    assert rc1 == -4 and (out == -1).all()
    gen[0] = 1
    words[3] = 4096  # and a size far past the line
    st1, rc1, keep1 = _run(segs[1], COLL_BCAST, out, out)
    assert rc1 == -5 and (out == -1).all()
    for s in segs:
        s.close()


def test_a_peer_past_the_generation_without_its_signature_differs_at_once():
    """A rank waiting for a peer's signature of a collective (its own, or an earlier gather's
    root's) fails at once when the peer's flags went past that generation without one (the peer's
    collectives took other generations: their calls differ) instead of polling a flag already
    set until the timeout."""
    import pycoll
    from pycoll.native import lib
    from pycoll.tl.shm.segment import COLL_BCAST

    def arrive(seg, rank):  # rank's arrive flag
        return np.frombuffer(seg.mm, np.uint64, count=1, offset=4096 + CTRL_BYTES * rank)

    segs = two_rank_segments()
    data = np.arange(100, dtype=np.int32)  # (400 B: through the slots)
    st0, rc0, keep0 = _run(segs[0], COLL_BCAST, data, data)
    assert rc0 == 0  # the root's part is done: it waits for rank 1's signature
    arrive(segs[0], 1)[0] = st0.gen0  # rank 1's flag past it, no signature of it in its ring
    spins = st0.spins
    rc0 = lib.pycoll_shm_progress(st0, 1000)
    assert rc0 == -7 and st0.spins - spins < 10, (rc0, st0.spins - spins)  # PC_EMISMATCH, no spinning
    with pytest.raises(pycoll.MismatchError, match="rank 1: none began at this generation"):
        segs[0].raise_native(rc0)
    for s in segs:
        s.close()
    # an eager gather's owed check: rank 1 signed a call rooted at rank 0 at generation g and owes
    # the check of it; rank 0's flag goes past g without a signature there
    segs = two_rank_segments()
    out = np.full(100, -1, np.int32)
    st1, rc1, keep1 = _run(segs[1], COLL_BCAST, out, out)
    assert rc1 == 0  # signed (root 0), waits for the root's data
    g = st1.gen0
    # (owed[0] in pc_shm_ctrl_t: two cache lines, pid, attached, info, the signatures, signs)
    owed = np.frombuffer(segs[1].mm, np.uint64, count=1,
                         offset=4096 + CTRL_BYTES + 2 * 64 + 16 + 32 + 8 * 40 + 8)  # (PC_SIGS 8)
    owed[0] = g
    assert lib.pycoll_shm_load(segs[1].base, 1, 5) == g  # (that is where the native code reads it)
    assert lib.pycoll_shm_settle(st1, 0) == 0  # rank 0 not there yet: owed still
    arrive(segs[1], 0)[0] = g
    spins = st1.spins
    assert lib.pycoll_shm_settle(st1, 1000) == -9 and st1.spins - spins < 10  # PC_EMISMATCH_EARLIER
    owed[0] = g
    assert lib.pycoll_shm_progress(st1, 1000) == -9  # (also where a call settles without waiting)
    with pytest.raises(pycoll.MismatchError, match="rank 0: none began at this generation"):
        segs[1].close()  # (the check still owed: it raises there too, once closed)
    segs[0].close()


def test_budget_of_a_native_call_never_exceeds_polls_and_a_closed_segment_is_broken():
    from pycoll.tl.shm.segment import COLL_BARRIER, ShmSegment

    seg = ShmSegment(0, 1, lambda b: [b], slot_bytes=4096)
    st = seg.new_state(COLL_BARRIER)
    empty = np.empty(0, np.uint8)
    seg.budget = 62  # as halved while peers kept it waiting
    for _ in range(10):  # each call that finishes at once doubles it, up to polls
        seg.start(st, empty, empty, True)
        assert seg.progress(st, 0.0)
        seg.turn, seg.tickets = 0, 0
        assert seg.budget <= seg.polls
    assert seg.budget == seg.polls
    seg.polls = 100
    assert seg.budget == 100
    seg.close()
    assert not seg.free() and "closed" in str(seg.broken)


def test_signatures_catch_ranks_that_disagree():
    """Every segment collective is signed at its start and done only once every rank's signature
    matches: ranks whose count, dtype, op, root or collective differ get PC_EMISMATCH (-7), never
    a result, and the error names each rank's call; ranks that agree finish as before."""
    import pycoll
    from pycoll.tl.shm.segment import COLL_ALLREDUCE, COLL_BARRIER, COLL_BCAST

    mismatch = -7
    a32, b32 = np.ones(100, np.int32), np.ones(101, np.int32)
    cases = [  # (rank 0's call, rank 1's call): kind, src, dst, root
        ((COLL_ALLREDUCE, a32, np.zeros(100, np.int32), 0),
         (COLL_ALLREDUCE, b32, np.zeros(101, np.int32), 0)),
        ((COLL_BCAST, a32, a32.copy(), 0), (COLL_BCAST, a32, a32.copy(), 1)),  # two roots: nobody reads
        ((COLL_ALLREDUCE, a32, np.zeros(100, np.int32), 0), (COLL_BARRIER, a32, a32, 0)),
        ((COLL_BCAST, a32[:2], a32[:2].copy(), 0), (COLL_BCAST, a32[:3], a32[:3].copy(), 0)),  # inline
    ]
    for call0, call1 in cases:
        segs = two_rank_segments()
        st0, rc0, keep0 = _run(segs[0], call0[0], call0[1], call0[2], root=call0[3])
        st1, rc1, keep1 = _run(segs[1], call1[0], call1[1], call1[2], root=call1[3])
        rcs = [rc0, rc1]
        for _ in range(20):
            rcs = [native.lib.pycoll_shm_progress(st, 1000) if rc == 0 else rc for st, rc in ((st0, rcs[0]),
                                                                                             (st1, rcs[1]))]
        assert rcs == [mismatch, mismatch], (call0[0], call1[0], rcs)
        with pytest.raises(pycoll.MismatchError, match="rank 0: .*; rank 1: ") as err:
            segs[0].raise_native(rcs[0])
        assert "differ" in str(err.value)
        for s in segs:
            s.close()
    # the same call on both ranks: done, and the message of a mismatch names the calls
    segs = two_rank_segments()
    x0, x1 = np.full(100, 1, np.int32), np.full(100, 2, np.int32)
    y0, y1 = np.zeros(100, np.int32), np.zeros(100, np.int32)
    st0, rc0, keep0 = _run(segs[0], COLL_ALLREDUCE, x0, y0)
    st1, rc1, keep1 = _run(segs[1], COLL_ALLREDUCE, x1, y1)
    for _ in range(20):
        rc0 = native.lib.pycoll_shm_progress(st0, 1000) if rc0 == 0 else rc0
        rc1 = native.lib.pycoll_shm_progress(st1, 1000) if rc1 == 0 else rc1
    assert (rc0, rc1) == (1, 1) and (y0 == 3).all() and (y1 == 3).all()
    assert "rank 0: allreduce 100 x int32 sum; rank 1: allreduce 100 x int32 sum" in segs[0].mismatch()
    for s in segs:
        s.close()


def test_a_peer_that_left_is_lost_only_if_it_did_not_do_its_part():
    """A rank that says it left (exited, raised, closed) makes a peer waiting for it raise
    PeerLostError naming it and how it left; a rank that left after finishing its part of the
    generation being waited on is not waited for, so it is not lost; the text is cut to fit."""
    import pycoll
    from pycoll.tl.shm.leaving import LEFT_RAISED
    from pycoll.tl.shm.segment import COLL_ALLREDUCE

    segs = two_rank_segments()
    x1, y1 = np.ones(2, np.int32), np.zeros(2, np.int32)
    st1, rc1, keep1 = _run(segs[1], COLL_ALLREDUCE, x1, y1)
    assert rc1 == 0  # rank 1 waits for rank 0, which never comes: it leaves
    segs[1].check_peers(st1)  # nobody left yet
    segs[0].leave(LEFT_RAISED, "ValueError: " + "x" * 100)
    segs[0].leave(LEFT_RAISED, "a second call changes nothing")
    with pytest.raises(pycoll.PeerLostError, match=r"rank 0 \(pid \d+, host .*\) raised ValueError: x+ while "
                       r"rank 1 waited in allreduce \(generation 1\)") as info:
        segs[1].check_peers(st1, now=True)
    assert info.value.rank == 0 and len(info.value.how) < 60 and isinstance(info.value, pycoll.TransportError)
    for s in segs:
        s.close()
    # both do a collective; rank 1 finishes first and leaves; rank 0, behind, still finishes it
    segs = two_rank_segments()
    x0, y0 = np.ones(2, np.int32), np.zeros(2, np.int32)
    st0, rc0, keep0 = _run(segs[0], COLL_ALLREDUCE, x0, y0)
    assert rc0 == 0  # waits for rank 1
    st1, rc1, keep1 = _run(segs[1], COLL_ALLREDUCE, x1, y1)
    assert rc1 == 1 and (y1 == 2).all()
    segs[1].close()  # closed its team: left
    segs[0].check_peers(st0, now=True)  # it reached this generation: not lost
    from pycoll.native import lib

    assert lib.pycoll_shm_progress(st0, 1000) == 1 and (y0 == 2).all()
    assert st0.gen == 2  # the next collective's: it would need rank 1
    with pytest.raises(pycoll.PeerLostError, match="closed its team"):
        segs[0].check_peers(st0, now=True)
    segs[0].close()


def test_a_signature_names_the_call():
    """A mismatch's text names each rank's call as it signed it; a gather (which signs its block
    size, marked) and a gatherv (which does not) read apart, in the segment's form as in the
    single-copy one."""
    from pycoll.tl.shm.segment import COLL_NAMES, describe_signature

    gather = COLL_NAMES.index("gather") | 0xff << 16 | 2 << 32  # (dtype code 0, no op, root 2)
    assert describe_signature(gather, 5, 5 | 1 << 63).startswith("gather 5 x ")
    assert describe_signature(gather, 5, 0).startswith("gatherv 5 x ")
    assert describe_signature(gather, 5, 0).endswith(" root 2")
    single = COLL_NAMES.index("gather (single copy)") | 0xff << 16 | 2 << 32
    assert describe_signature(single, 5, 5 | 1 << 63).startswith("gather (single copy) 5 x ")
    assert describe_signature(single, 5, 0).startswith("gatherv (single copy) 5 x ")


def test_blocks_through_the_slot_by_the_single_copys_speed():
    """The single-copy scatter(v) and alltoall(v) pass blocks up to CMA_INLINE_BYTES through the
    sender's slot (more where the read is slow); on two ranks where it is slow, every block that
    fits; ``cma_inline`` overrides both."""
    from pycoll.tl.shm.segment import CMA_INLINE_BYTES

    segs = two_rank_segments(slot_bytes=1 << 16)
    seg = segs[0]
    assert seg.cma_inline_bytes() == CMA_INLINE_BYTES[False] and seg.new_state(0).inline_max == 8 << 10
    seg.cma_slow = True
    assert seg.cma_inline_bytes() == seg.slot_bytes == 1 << 16 and seg.new_state(0).inline_max == 1 << 16
    seg.size = 3  # (as a segment of three ranks would)
    assert seg.cma_inline_bytes() == CMA_INLINE_BYTES[True]
    seg.size, seg.cma_inline = 2, 0
    assert seg.cma_inline_bytes() == 0
    for s in segs:
        s.close()


def test_mapped_allreduce_checks_the_offsets_it_reads():
    """The allreduce of arrays every rank maps: each rank's own buffers must lie in its part of
    the region (else an error before anything is published), and the offsets and region a peer
    publishes are checked before they are used (out of its part: out of bounds; another region,
    or pairs a slot kept from an earlier generation: disagree), nothing read or written."""
    import mmap

    import pycoll
    from pycoll.native import DTYPE_CODES, OP_CODES, lib
    from pycoll.tl.shm.mapped import Region, address
    from pycoll.tl.shm.segment import COLL_ALLREDUCE_MAPPED

    part = 4096
    mm = mmap.mmap(-1, 2 * part)  # both ranks map it (they are threads of this process)
    view = np.frombuffer(mm, np.int32)
    region = Region(mm, address(view), part, 2, ident=11)
    per = part // 4

    def start(seg, rank, src, dst, ident=11):
        st = seg.new_state(COLL_ALLREDUCE_MAPPED, OP_CODES[pycoll.ReduceOp.SUM],
                           DTYPE_CODES[np.dtype(np.int32)])
        seg.bind_regions(st, (region, region))
        st.region_id[0] = st.region_id[1] = ident
        seg.start(st, src, dst, True)
        return st

    def parts(count, offset=0):
        return [view[r * per + offset:r * per + offset + count] for r in range(2)]

    segs = two_rank_segments()
    ins = parts(100, 10)
    ins[0][:], ins[1][:] = np.arange(100), 1000
    outs = parts(100, 200)
    sts = [start(segs[r], r, ins[r], outs[r]) for r in range(2)]
    assert lib.pycoll_shm_progress(sts[0], 100) == 0  # its offsets published; rank 1 not there
    assert lib.pycoll_shm_progress(sts[1], 1000) in (0, 1)
    assert lib.pycoll_shm_progress(sts[0], 1000) == 1 and lib.pycoll_shm_progress(sts[1], 1000) == 1
    for r in range(2):
        assert (outs[r] == np.arange(100) + 1000).all() and (ins[1] == 1000).all()
    for s in segs:
        s.close()
    # this rank's buffer in the other rank's part: out of bounds before anything is published
    segs = two_rank_segments()
    st = start(segs[0], 0, parts(10)[1], parts(10)[1])
    assert lib.pycoll_shm_progress(st, 10) == -3
    for s in segs:
        s.close()
    # a peer's published offset past its part, or another region: nothing read or written
    for field, value, rc in ((1, part - 8, -3), (0, 12, -5), (4, 0, -5)):
        segs = two_rank_segments()
        ins, outs = parts(100), parts(100, 200)
        outs[0][:] = -1
        st1 = start(segs[1], 1, ins[1], outs[1])
        assert lib.pycoll_shm_progress(st1, 10) == 0
        pairs = np.frombuffer(segs[0].mm, np.uint64, count=5, offset=segs[0].slot_offset(st1.gen, 1))
        assert pairs[0] == 11 and pairs[1] == 0 and pairs[3] == 200 * 4
        pairs[field] = value
        st0 = start(segs[0], 0, ins[0], outs[0])
        assert lib.pycoll_shm_progress(st0, 1000) == rc and (outs[0] == -1).all()
        for s in segs:
            s.close()


def test_a_process_measures_its_read_cost_once_and_every_team_decides_from_the_ranks_median(monkeypatch):
    """What a process_vm_readv costs here is measured at the process's first team on a segment and
    taken again by its next teams (2-3 ms of each bootstrap before); the team's decision is still
    the median of every rank's figure, the same on every rank."""
    from pycoll.tl.shm import transport

    measured = []
    monkeypatch.setattr(transport, "_MEASURED", {})
    monkeypatch.setattr(transport, "cma_cost", lambda pid: measured.append(pid) or 2.5)
    assert transport.own_cma_cost() == 2.5 and transport.own_cma_cost() == 2.5 and len(measured) == 1
    seg = type("Seg", (), {"rank": 0, "pids": [0, 0, 0], "cma_slow": None})()  # (rank 0 reads nothing)
    votes = iter([[b"1", b"1", b"1"], [b"1|1.5", b"0|inf", b"1|3.0"]])
    assert transport.cma_works(seg, lambda value: next(votes)) is False  # (a rank could not read)
    assert seg.cma_slow is True and len(measured) == 1  # (median of 1.5, inf, 3.0: 3.0 > 2.0)
