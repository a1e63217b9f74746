"""Call marks in the one-host point-to-point descriptors (``native/shm.c``'s ``pycoll_p2p_*``,
ShmTransport), two ranks' segments and transports in one process: a marked message's descriptor
carries its mark ahead of a payload of its own size (the wire the native executor shares); a
receive compares mark and size before it reads any of the payload, for a message that came before
or after it was posted; an unmarked receive takes a marked message's payload; forged flags, sizes
and states are refused, never read out of bounds. The ranks and native programs:
tests/procs/test_shm_marks.py."""

import numpy as np
import pytest

import pycoll
from pycoll.agreement import mark_fields
from pycoll.calls import Call
from pycoll.tl.marks import MARK_BYTES, Mark
from tests.unit.test_shm import two_rank_segments

native = pytest.importorskip("pycoll.native", reason="the native module is not built")
lib, ffi = native.lib, native.ffi
RING, DESC_WORDS = 64, 16  # (PC_RING; a descriptor's 128 bytes)
ESTATE = -4  # (PC_ESTATE)
TAG = ("c", 7, 0)  # (an untagged collective's message key, step 0)


@pytest.fixture
def pair():
    """Two ranks' segments and ShmTransports, and the marks' judge (a local team's)."""
    from pycoll.tl.shm.transport import ShmTransport

    segs = two_rank_segments()
    teams = pycoll.local_teams(2)
    yield segs, [ShmTransport(s) for s in segs], teams[1].planner.marks  # (rank 1 receives)
    for t in teams:
        t.close()
    for s in segs:
        s.close()


def mark(owner, dtype=np.float32, op=pycoll.ReduceOp.SUM, count=100, history=5):
    buf = np.zeros(count, dtype)
    made = Mark(mark_fields(Call("allreduce", buf, buf, op, 0, None, buf.nbytes), "rd"), owner)
    made.stamp(history)
    return made


def descriptor(seg, src, dst, slot):
    """The 16 words of descriptor ``slot`` of the ring from ``src`` to ``dst`` in ``seg``."""
    header = np.frombuffer(seg.mm, np.uint64, count=9)
    at = int(header[8]) // 8 + ((src * seg.size + dst) * RING + slot) * DESC_WORDS  # (p2p_off)
    return np.frombuffer(seg.mm, np.uint64, count=at + DESC_WORDS)[at:]


def take(seg, src, slot):
    out, theirs = ffi.new("uint64_t[6]"), ffi.new("uint8_t[]", MARK_BYTES)
    rc = lib.pycoll_p2p_take(seg.base, seg.total, seg.size, src, seg.rank, slot, out, theirs)
    return rc, list(out), bytes(ffi.buffer(theirs))


def test_a_marked_message_carries_its_mark_ahead_of_its_own_payload(pair):
    segs, (t0, t1), judge = pair
    m = mark(judge)
    for slot, nbytes in enumerate((8, 32, 33, 4096)):  # (32 B and less: in the descriptor)
        data = np.arange(nbytes, dtype=np.uint8)
        t0.isend_marked(data, 1, (*TAG[:2], slot), m)
        rc, out, theirs = take(segs[1], 0, slot)
        assert rc == 1 and out[2] == nbytes and out[5] == 1 and theirs == m.blob, (nbytes, out)
        got = np.zeros(nbytes, np.uint8)
        req = t1.irecv_marked(got, 0, (*TAG[:2], slot), m)
        assert req.test() and np.array_equal(got, data), nbytes
    t0.isend(np.ones(8, np.uint8), 1, ("c", 8, 0))  # unmarked: flagged so, no mark read
    descriptor(segs[1], 0, 1, 4)[12:] = 0xABAB  # (what an earlier marked message left there)
    rc, out, theirs = take(segs[1], 0, 4)
    assert rc == 1 and out[5] == 0 and theirs == bytes(MARK_BYTES), out
    assert t1.irecv(np.zeros(8, np.uint8), 0, ("c", 8, 0)).test()
    payload = 8 + 32 + 33 + 4096 + 8  # (marks are no payload)
    assert t0.traffic.total()["sent"] == t1.traffic.total()["received"] == payload


def test_receives_refuse_another_call_before_they_read_it(pair):
    segs, (t0, t1), judge = pair
    mine, int32, sized = mark(judge), mark(judge, np.int32), mark(judge, count=101)
    cases = [("posted", mine, int32, 400, "allreduce 100 x int32 sum"),
             ("stashed", mine, int32, 400, "allreduce 100 x int32 sum"),
             ("posted", mine, mine, 404, "rank 0 sent rank 1 404 B where it expects 400 B"),
             ("stashed", mine, None, 400, "carries no call mark"),
             ("posted", mine, sized, 400, "allreduce 101 x float32 sum")]
    for seq, (when, theirs_is, sent, nbytes, words) in enumerate(cases):
        tag = ("c", 20 + seq, 0)
        out = np.full(100, -1.0, np.float32)
        if when == "posted":
            req = t1.irecv_marked(out, 0, tag, theirs_is)
        data = np.ones(nbytes, np.uint8)
        send = t0.isend(data, 1, tag) if sent is None else t0.isend_marked(data, 1, tag, sent)
        t1.progress()
        if when == "stashed":
            assert t1.has_stash()
            req = t1.irecv_marked(out, 0, tag, theirs_is)
        with pytest.raises(pycoll.MismatchError, match=words):
            req.test()
        assert (out == -1.0).all(), (when, words)  # (none of its payload delivered)
        t0.progress()
        assert send.test(), (when, words)  # (consumed all the same: the send completes)
        assert not t1.has_stash(), (when, words)
    # an unmarked receive takes a marked message's payload, as any other
    got = np.zeros(400, np.uint8)
    t0.isend_marked(np.full(400, 3, np.uint8), 1, ("c", 40, 0), mine)
    req = t1.irecv(got, 0, ("c", 40, 0))
    assert req.test() and req.nbytes == 400 and (got == 3).all()


def test_forged_descriptors_are_refused_not_read_out_of_bounds(pair):
    """A peer's descriptor whose flags, state or size no sender writes: refused by the take (the
    transport loses that peer), or refused as another call's before any payload is read."""
    segs, (t0, t1), judge = pair
    m = mark(judge)
    # the take (on the ring from rank 1 to rank 0, which no receive here reads)
    for slot, (word, value) in enumerate(((8, 2), (8, 1 << 63), (0, 7))):  # flags, flags, state
        t1.isend_marked(np.ones(8, np.uint8), 0, ("c", 50 + slot, 0), m)
        descriptor(segs[0], 1, 0, slot)[word] = value
        assert take(segs[0], 1, slot)[0] == ESTATE, (word, value)
    # a marked descriptor that claims a payload far larger than the receive, at no valid address:
    # refused on its size, nothing read (a read of it would fail: a TransportError, the peer lost)
    t0.isend_marked(np.ones(8, np.uint8), 1, ("c", 60, 0), m)
    d = descriptor(segs[1], 0, 1, 0)
    d[3], d[4] = 1 << 30, 8
    out = np.full(8, 9, np.uint8)
    req = t1.irecv_marked(out, 0, ("c", 60, 0), m)
    with pytest.raises(pycoll.MismatchError, match=f"{1 << 30} B where it expects 8 B"):
        req.test()
    assert (out == 9).all() and t1.lost(0) is None
    # the read checks the descriptor's size against the caller's: an inline payload is never
    # copied past the descriptor, nor into more than the caller gave
    t0.isend_marked(np.full(8, 4, np.uint8), 1, ("c", 61, 0), m)
    d = descriptor(segs[1], 0, 1, 1)
    d[3] = 1 << 20
    to = np.zeros(8, np.uint8)
    assert lib.pycoll_p2p_read(segs[1].base, segs[1].total, 2, 0, 1, 1, segs[1].pids[0], ffi.from_buffer(to),
                               0, 8) == ESTATE
    d[3] = 8  # (as it was sent)
    assert t1.irecv_marked(to, 0, ("c", 61, 0), m).test() and (to == 4).all()
    # forged flags through the transport: the peer is lost, the receive fails (no crash)
    t0.isend_marked(np.ones(8, np.uint8), 1, ("c", 62, 0), m)
    descriptor(segs[1], 0, 1, 2)[8] = 3
    req = t1.irecv_marked(np.zeros(8, np.uint8), 0, ("c", 62, 0), m)
    with pytest.raises(pycoll.TransportError, match="bad descriptor from rank 0"):
        req.test()
