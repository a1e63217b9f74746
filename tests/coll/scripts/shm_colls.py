"""Run under mpiexec by tests/coll/test_shm.py: collectives on the shared segment vs numpy."""

import os
import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import ReduceOp, Team
from pycoll.ops import DTYPES
from pycoll.tl.shm import segment as shm_segment
from pycoll.tl.shm.segment import DEFAULT_SLOT_BYTES
from tests.rank import run_rank
from tests.reference import ALL_DTYPES, assert_same, expected, make_input, valid_ops

SMALL_SLOT_BYTES = 4096


def check_allreduce(team, dtype, op, count, in_place, seed=0):
    n, r = team.size, team.rank
    ins = [make_input(dtype, op, rr, count, seed) for rr in range(n)]
    buf = ins[r].copy()
    out = np.zeros(count, DTYPES[dtype])
    got = team.allreduce(buf, None if in_place else out, op).wait()
    assert_same([got], expected(ins, op), f"shm n={n} {dtype} {op.name} count={count} in_place={in_place}")


BLOCK_DTYPES = ("float32", "float64", "int32", "bfloat16")
BLOCK_OPS = (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG)


def block_layouts(n, per_slot):
    """(counts, displs) of allgatherv/reduce_scatterv cases: unequal blocks, empty ones, one larger
    than a slot, gaps between blocks (displs)."""
    counts = [(3 * k + 1) % 5 for k in range(n)]  # 1, 4, 2, 0, ...
    big = [per_slot + 3 if k == n - 1 else k for k in range(n)]  # block 0 empty, the last > a slot
    yield counts, None
    yield big, None
    yield [0] * n, None
    displs = [sum(big[:k]) + 5 * k + 2 for k in range(n)]  # gaps, not back to back
    yield big, displs
    yield counts, [sum(counts[k + 1:]) for k in range(n)]  # blocks in reverse rank order


def check_blocks(team, slot_bytes):
    """reduce, allgather(v), reduce_scatter(v) on the segment (algorithm="shm") vs numpy."""
    n, r = team.size, team.rank
    shm = {"algorithm": "shm"}
    for dtype in BLOCK_DTYPES:
        dt = DTYPES[dtype]
        per_slot = slot_bytes // dt.itemsize
        ops = [op for op in BLOCK_OPS if op in valid_ops(dtype)]
        for i, op in enumerate(ops):
            for count in (0, 1, 2 * n + 1, 2 * per_slot + 3):
                what = f"n={n} {dtype} {op.name} count={count}"
                ins = [make_input(dtype, op, rr, count, seed=i) for rr in range(n)]
                want = expected(ins, op)
                # reduce to every root, in place at the root every other time
                for root in range(n):
                    in_place = (root + count) % 2 == 0
                    src = ins[r].copy()
                    out = np.full(count, 99, dt)
                    if r == root:
                        got = team.reduce(src, None if in_place else out, op, root, **shm).wait()
                        assert_same([got], want, f"reduce root={root} in_place={in_place} {what}")
                        if not in_place:
                            assert_same([src], ins[r], f"reduce: root's sendbuf changed {what}")
                    else:
                        team.reduce(src, out, op, root, **shm).wait()
                        assert_same([src], ins[r], f"reduce: sendbuf of rank {r} changed {what}")
                        assert (out.view(np.uint8) == np.full(count, 99, dt).view(np.uint8)).all(), what
                    if r == root and count:  # bitwise what the shm allreduce computes
                        ar = team.allreduce(ins[r].copy(), None, op, **shm).wait()
                        assert ar.tobytes() == got.tobytes(), f"reduce != allreduce {what}"
                    elif count:
                        team.allreduce(ins[r].copy(), None, op, **shm).wait()
                # reduce_scatter: block b of the whole buffer goes to rank b
                whole = [make_input(dtype, op, rr, n * count, seed=i + 7) for rr in range(n)]
                want_rs = expected(whole, op)
                rs = np.full(count, 99, dt)
                team.reduce_scatter(whole[r].copy(), rs, op, **shm).wait()
                assert_same([rs], want_rs[r * count:(r + 1) * count], f"reduce_scatter {what}")
                buf = whole[r].copy()  # recvbuf is this rank's block of sendbuf (MPI_IN_PLACE-like)
                team.reduce_scatter(buf, buf[r * count:(r + 1) * count], op, **shm).wait()
                assert_same([buf[r * count:(r + 1) * count]], want_rs[r * count:(r + 1) * count],
                            f"reduce_scatter into its own block {what}")
            # allgather (op-independent): out of place and in place
            for count in (0, 1, 2 * n + 1, 2 * per_slot + 3):
                what = f"n={n} {dtype} count={count}"
                ins = [make_input(dtype, ReduceOp.SUM, rr, count, seed=3) for rr in range(n)]
                want = np.concatenate(ins) if count else np.zeros(0, dt)
                ag = np.full(n * count, 99, dt)
                team.allgather(ins[r], ag, **shm).wait()
                assert_same([ag], want, f"allgather {what}")
                ag = np.full(n * count, 99, dt)
                ag[r * count:(r + 1) * count] = ins[r]
                team.allgather(None, ag, **shm).wait()
                assert_same([ag], want, f"allgather in place {what}")
        # the v-variants
        for counts, displs in block_layouts(n, per_slot):
            what = f"n={n} {dtype} counts={counts} displs={displs}"
            offs = displs if displs is not None else [sum(counts[:k]) for k in range(n)]
            total = max([o + c for o, c in zip(offs, counts)] + [0])
            ins = [make_input(dtype, ReduceOp.SUM, rr, counts[rr], seed=5) for rr in range(n)]
            want = np.full(total, 99, dt)
            for rr in range(n):
                want[offs[rr]:offs[rr] + counts[rr]] = ins[rr]
            for in_place in (False, True):
                agv = np.full(total, 99, dt)
                if in_place:
                    agv[offs[r]:offs[r] + counts[r]] = ins[r]
                team.allgatherv(None if in_place else ins[r], agv, counts, displs, **shm).wait()
                assert_same([agv], want, f"allgatherv in_place={in_place} {what}")
            if displs is not None:
                continue  # reduce_scatterv: blocks back to back
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                whole = [make_input(dtype, op, rr, sum(counts), seed=9) for rr in range(n)]
                want_rs = expected(whole, op)
                rsv = np.full(counts[r], 99, dt)
                team.reduce_scatterv(whole[r], rsv, counts, op, **shm).wait()
                assert_same([rsv], want_rs[offs[r]:offs[r] + counts[r]], f"reduce_scatterv {op.name} {what}")
    # mixed with the other segment collectives, several in flight, completed in reverse order
    bufs = [np.full(1000 * (k + 1), float(r + k)) for k in range(3)]
    outs = [np.zeros(n * b.size) for b in bufs]
    reqs = [team.allgather(b, o, **shm) for b, o in zip(bufs, outs)]
    red = np.zeros(5000)
    reqs.append(team.reduce(np.full(5000, r + 1.0), red, root=n - 1, **shm))
    reqs.append(team.barrier())
    reqs.append(team.barrier())
    bc = np.full(100, r, np.int64)
    reqs.append(team.bcast(bc, root=n - 1))
    rsb = np.zeros(777, np.float32)
    reqs.append(team.reduce_scatter(np.ones(777 * n, np.float32), rsb, **shm))
    pycoll.wait_all(list(reversed(reqs)))
    for k, o in enumerate(outs):
        assert (o == np.repeat(np.arange(n, dtype=float) + k, bufs[k].size)).all(), k
    if r == n - 1:
        assert (red == n * (n + 1) / 2).all()
    assert (bc == n - 1).all() and (rsb == n).all()


def check_data_moving(team, slot_bytes, alg="shm"):
    """gather(v), scatter(v), alltoall(v) on the segment (algorithm ``alg``: "shm", or "cma",
    the single-copy forms) vs numpy: every root, in place, unequal, empty and multi-chunk blocks,
    gaps between blocks, counts known only at the root, mixed with the other segment
    collectives."""
    n, r = team.size, team.rank
    shm = {"algorithm": alg}
    for dtype in ("float32", "int64", "bfloat16", "complex128", "bool"):
        dt = DTYPES[dtype]
        per_slot = slot_bytes // dt.itemsize
        for count in (0, 1, 2 * n + 1, per_slot // n + 1, 2 * per_slot + 3):
            what = f"n={n} {dtype} count={count}"
            ins = [make_input(dtype, ReduceOp.SUM, rr, count, seed=11) for rr in range(n)]
            whole = np.concatenate(ins) if count else np.zeros(0, dt)
            for root in sorted({0, n - 1}):
                in_place = (root + count) % 2 == 1
                # gather
                if r == root:
                    g = np.full(n * count, 7, dt)
                    if in_place:
                        g[r * count:(r + 1) * count] = ins[r]
                    team.gather(None if in_place else ins[r], g, root, **shm).wait()
                    assert_same([g], whole, f"gather root={root} in_place={in_place} {what}")
                else:
                    team.gather(ins[r], None, root, **shm).wait()
                # scatter
                out = np.full(count, 7, dt)
                if r == root:
                    src = whole.copy()
                    if in_place:
                        team.scatter(src, None, root, **shm).wait()
                        out = src[r * count:(r + 1) * count]
                    else:
                        team.scatter(src, out, root, **shm).wait()
                    assert_same([src], whole, f"scatter: the root's sendbuf changed {what}")
                else:
                    team.scatter(None, out, root, **shm).wait()
                assert_same([out], ins[r], f"scatter root={root} in_place={in_place} {what}")
            # alltoall: block b of rank r's sendbuf goes to rank b
            sends = [make_input(dtype, ReduceOp.SUM, rr, n * count, seed=13) for rr in range(n)]
            want = (np.concatenate([s_[r * count:(r + 1) * count] for s_ in sends]) if count
                    else np.zeros(0, dt))
            a2a = np.full(n * count, 7, dt)
            team.alltoall(sends[r].copy(), a2a, **shm).wait()
            assert_same([a2a], want, f"alltoall {what}")
            buf = sends[r].copy()
            team.alltoall(buf, buf, **shm).wait()
            assert_same([buf], want, f"alltoall in place {what}")
        # the v-variants: unequal, empty, multi-chunk blocks; gaps; counts only at the root
        for counts, displs in block_layouts(n, per_slot):
            what = f"n={n} {dtype} counts={counts} displs={displs}"
            offs = displs if displs is not None else [sum(counts[:k]) for k in range(n)]
            total = max([o + c for o, c in zip(offs, counts)] + [0])
            ins = [make_input(dtype, ReduceOp.SUM, rr, counts[rr], seed=17) for rr in range(n)]
            whole = np.full(total, 7, dt)
            for rr in range(n):
                whole[offs[rr]:offs[rr] + counts[rr]] = ins[rr]
            for root in sorted({0, n - 1}):
                told = (root + len(what)) % 2 == 0  # the others pass counts too, or leave them to the root
                if r == root:
                    g = np.full(total, 7, dt)
                    team.gatherv(ins[r], g, counts, displs, root, **shm).wait()
                    assert_same([g], whole, f"gatherv root={root} {what}")
                else:
                    team.gatherv(ins[r], None, counts if told else None, displs if told else None, root,
                                 **shm).wait()
                out = np.full(counts[r], 7, dt)
                if r == root:
                    team.scatterv(whole, out, counts, displs, root, **shm).wait()
                else:
                    team.scatterv(None, out, counts if told else None, displs if told else None, root,
                                  **shm).wait()
                assert_same([out], ins[r], f"scatterv root={root} {what}")
            # alltoallv: rank s sends rank d (s + 2 d) % 5 elements; one block larger than a slot
            sc = [[(s_ + 2 * d) % 5 + (per_slot + 1 if (s_, d) == (n - 1, 0) else 0) for d in range(n)]
                  for s_ in range(n)]
            sendbuf = make_input(dtype, ReduceOp.SUM, r, sum(sc[r]), seed=19)
            rcounts = [sc[s_][r] for s_ in range(n)]
            rdispls = [sum(rcounts[:k]) + 3 * k for k in range(n)]  # gaps between received blocks
            recv = np.full(sum(rcounts) + 3 * n, 7, dt)
            team.alltoallv(sendbuf, recv, sc[r], rcounts, None, rdispls, **shm).wait()
            for s_ in range(n):
                theirs = make_input(dtype, ReduceOp.SUM, s_, sum(sc[s_]), seed=19)
                lo = sum(sc[s_][:r])
                assert_same([recv[rdispls[s_]:rdispls[s_] + rcounts[s_]]], theirs[lo:lo + sc[s_][r]],
                            f"alltoallv from {s_} {what}")
    # mixed with the other segment collectives, several in flight, completed in reverse order
    g = np.zeros(3 * n, np.int32)
    a2a = np.zeros(2 * n, np.float64)
    sc = np.zeros(4, np.int16)
    reqs = [team.gather(np.full(3, r, np.int32), g if r == 0 else None, 0, **shm),
            team.barrier(),
            team.alltoall(np.arange(2 * n, dtype=np.float64) + 100 * r, a2a, **shm),
            team.scatter(np.repeat(np.arange(n, dtype=np.int16), 4) if r == n - 1 else None, sc, n - 1,
                         **shm),
            team.allreduce(np.ones(5))]
    pycoll.wait_all(list(reversed(reqs)))
    if r == 0:
        assert (g == np.repeat(np.arange(n, dtype=np.int32), 3)).all()
    assert (a2a == np.concatenate([100 * s_ + np.arange(2 * r, 2 * r + 2) for s_ in range(n)])).all(), a2a
    assert (sc == r).all()
    # persistent, refilled between starts
    mine, gathered = np.zeros(2, np.int64), np.zeros(2 * n, np.int64)
    pg = team.gather_init(mine, gathered if r == 0 else None, 0, **shm)
    part, parts = np.zeros(3, np.int64), np.zeros(3 * n, np.int64)
    ps = team.scatter_init(parts if r == 0 else None, part, 0, **shm)
    for run in range(3):
        mine[:] = r + run
        pg.start().wait()
        if r == 0:
            assert (gathered == np.repeat(np.arange(n) + run, 2)).all()
            parts[:] = np.repeat(np.arange(n), 3) * 10 + run
        ps.start().wait()
        assert (part == 10 * r + run).all(), part


def check_blocks_default(team):
    """Sizes across the default slot (1 MiB per rank), with the team's own algorithm selection."""
    n, r = team.size, team.rank
    per_slot = DEFAULT_SLOT_BYTES // 4
    for count in (per_slot + 1, 5 * per_slot // 2 + 3):
        ins = [make_input("float32", ReduceOp.SUM, rr, count) for rr in range(n)]
        want = expected(ins, ReduceOp.SUM)
        out = np.zeros(count, np.float32)
        team.reduce(ins[r], out, root=n - 1, algorithm="shm").wait()
        if r == n - 1:
            assert_same([out], want, f"reduce count={count}")
        ag = np.zeros(n * count, np.float32)
        team.allgather(ins[r], ag, algorithm="shm").wait()
        assert_same([ag], np.concatenate(ins), f"allgather count={count}")
        whole = [make_input("bfloat16", ReduceOp.AVG, rr, n * count) for rr in range(n)]
        want = expected(whole, ReduceOp.AVG)
        rs = np.zeros(count, DTYPES["bfloat16"])
        team.reduce_scatter(whole[r], rs, ReduceOp.AVG, algorithm="shm").wait()
        assert_same([rs], want[r * count:(r + 1) * count], f"reduce_scatter count={count}")
    counts = [per_slot * 2 + 1 if k == 0 else 3 * k for k in range(n)]
    agv = np.zeros(sum(counts), np.float64)
    mine = np.full(counts[r], r + 0.5)
    team.allgatherv(mine, agv, counts, algorithm="shm").wait()
    assert (agv == np.repeat(np.arange(n) + 0.5, counts)).all()


def unaligned(count, dtype):
    """A zeroed output of ``count`` elements whose start is not 16-byte aligned (the streamed
    copy of a large output writes a head, whole lines and a tail)."""
    base = np.zeros(count + 1, dtype)
    out = base[1:]
    assert out.ctypes.data % 16
    return out


def check_bcast_cma(team):
    """The single-copy bcast: every root, empty to multi-MiB buffers, several dtypes, mixed with
    segment collectives of the two-copy kind."""
    n, r = team.size, team.rank
    for dtype in ("float32", "int8", "complex128", "bfloat16"):
        dt = DTYPES[dtype]
        for count in (0, 1, 1000, (3 << 20) // dt.itemsize + 7):
            want = make_input(dtype, ReduceOp.SUM, 5, count, seed=3)
            for root in range(n):
                buf = want.copy() if r == root else np.zeros(count, dt)
                team.bcast(buf, root=root, algorithm="cma").wait()
                assert_same([buf], want, f"bcast cma root={root} {dtype} count={count}")
                got = team.allreduce(np.full(3, r, np.int32)).wait()
                assert (got == n * (n - 1) // 2).all()


def check_large(team):
    """Outputs of 16 MiB and more (written with non-temporal stores), unaligned and with a tail
    that is not whole lines, for every segment collective that copies its output out."""
    n, r = team.size, team.rank
    shm = {"algorithm": "shm"}
    count = (16 << 20) // 4 + 13  # float32: just over 16 MiB
    ins = [np.arange(count, dtype=np.float32) * (rr + 1) for rr in range(n)]
    out = unaligned(count, np.float32)
    team.allreduce(ins[r], out, **shm).wait()
    assert (out == sum(ins)).all(), "allreduce"
    buf = ins[0].copy() if r == 0 else unaligned(count, np.float32)
    team.bcast(buf, root=0, **shm).wait()
    assert (buf == ins[0]).all(), "bcast"
    m = count // n + 3  # a block per rank; the whole just over 16 MiB
    blocks = [np.arange(m, dtype=np.int32) + 1000 * rr for rr in range(n)]
    ag = unaligned(n * m, np.int32)
    team.allgather(blocks[r], ag, **shm).wait()
    assert (ag == np.concatenate(blocks)).all(), "allgather"
    root = n - 1
    g = unaligned(n * m, np.int32) if r == root else None
    team.gather(blocks[r], g, root=root, **shm).wait()
    if r == root:
        assert (g == np.concatenate(blocks)).all(), "gather"
    big = (16 << 20) // 4 + 5  # scatter: each rank's own block over 16 MiB
    whole = np.arange(n * big, dtype=np.int32) if r == root else None
    sc = unaligned(big, np.int32)
    team.scatter(whole, sc, root=root, **shm).wait()
    assert (sc == np.arange(r * big, (r + 1) * big, dtype=np.int32)).all(), "scatter"
    send = np.arange(n * m, dtype=np.int32) + 7 * r
    a2a = unaligned(n * m, np.int32)
    team.alltoall(send, a2a, **shm).wait()
    want = np.concatenate([np.arange(r * m, (r + 1) * m, dtype=np.int32) + 7 * rr for rr in range(n)])
    assert (a2a == want).all(), "alltoall"


def check_two_ranks_through_the_slot(comm):
    """On two ranks where the single copy is slow, scatterv and alltoallv pass every block that fits
    the sender's slot through it (far above the 64 KiB of more ranks), and read the others from
    the sender's memory: blocks just under, at and over what fits, every root, right data."""
    slot = 256 << 10
    shm_segment.DEFAULT_SLOT_BYTES = slot
    team = Team.from_mpi(comm)
    shm_segment.DEFAULT_SLOT_BYTES = SMALL_SLOT_BYTES
    seg, r = team.shared, team.rank
    seg.cma_slow = True  # (as measured on a host where it is: only the blocks' way changes)
    assert seg.cma_inline_bytes() == slot
    cma = {"algorithm": "cma"}
    for size in (100_000, slot - 64, slot - 63, slot + 1):  # (the slot holds the pairs first)
        blocks = [(np.arange(size) * (k + 3) + size).astype(np.uint8) for k in range(2)]
        for root in (0, 1):
            out = np.zeros(size, np.uint8)
            whole = np.concatenate(blocks) if r == root else None
            team.scatterv(whole, out, [size, size] if r == root else None, None, root, **cma).wait()
            assert (out == blocks[r]).all(), (size, root)
        send = np.concatenate([blocks[k] + r for k in range(2)])
        recv = np.zeros(2 * size, np.uint8)
        team.alltoallv(send, recv, [size, size], [size, size], **cma).wait()
        assert (recv == np.concatenate([blocks[r] + k for k in range(2)])).all(), size
    team.close()


def main(mode):
    if mode in ("blocks", "data", "data-cma"):  # small slots: every size above a few KiB takes chunks
        shm_segment.DEFAULT_SLOT_BYTES = SMALL_SLOT_BYTES
    comm = MPI.COMM_WORLD
    team = Team.from_mpi(comm)
    n, r = team.size, team.rank
    expect_shm = n > 1 and "shm" in os.environ.get("PYCOLL_TLS", "shm")
    assert (team.shared is not None) == expect_shm, (team.shared, expect_shm)
    if mode == "blocks":
        check_blocks(team, SMALL_SLOT_BYTES)
        return
    if mode.startswith("data") and n == 1:
        return  # one rank has no segment
    if mode == "data":
        check_data_moving(team, SMALL_SLOT_BYTES)
        return
    if mode == "data-default-slot":
        check_data_moving(team, DEFAULT_SLOT_BYTES)
        return
    if mode == "blocks-default-slot":  # a few sizes across the default (1 MiB) slot
        check_blocks_default(team)
        return
    if mode == "large":
        check_large(team)
        return
    if mode == "data-cma":  # the single-copy forms (small slots: the segment forms between them chunk)
        assert team.shared.cma, "this host does not let the ranks read each other's memory"
        slow = comm.allgather(team.shared.cma_slow)  # measured by each, agreed by all
        assert len(set(slow)) == 1, f"ranks disagree on whether the single copy is slow: {slow}"
        # small blocks travel through the sender's slot while it has room, the others are read
        # from its memory: small slots mix both in one call
        check_data_moving(team, SMALL_SLOT_BYTES, alg="cma")
        if n == 3:  # every block read from the sender's memory
            team.shared.cma_inline = 0
            check_data_moving(team, SMALL_SLOT_BYTES, alg="cma")
            team.shared.cma_inline = None
        if n == 2:  # every block that fits through the slot (two ranks where the single copy is slow)
            check_two_ranks_through_the_slot(comm)
        check_bcast_cma(team)
        return
    if mode == "matrix":
        for dtype in ALL_DTYPES:
            per_slot = DEFAULT_SLOT_BYTES // DTYPES[dtype].itemsize
            for i, op in enumerate(valid_ops(dtype)):
                for count in (0, 1, n + 1, 1000, per_slot + 1):
                    check_allreduce(team, dtype, op, count, in_place=(i + count) % 2 == 0)
        for count in (64 << 20) // 4, 5 * (DEFAULT_SLOT_BYTES // 4) // 2 + 1:
            check_allreduce(team, "float32", ReduceOp.SUM, count, in_place=False)
            check_allreduce(team, "float32", ReduceOp.MAX, count, in_place=True)
    # concurrent collectives on one team, completed in any order
    bufs = [np.full(1000 * (k + 1), float(r + k)) for k in range(6)]
    reqs = [team.allreduce(b) for b in bufs]
    breq = team.bcast(np.full(10, r, np.int32), root=n - 1)
    bar = team.barrier()
    pycoll.wait_all(list(reversed(reqs)) + [breq, bar])
    for k, b in enumerate(bufs):
        assert (b == sum(rr + k for rr in range(n))).all(), k
    assert (breq.wait() == n - 1).all()
    # bcast from every root, sizes across chunk boundaries
    for root in sorted({0, n // 2, n - 1}):
        for count in (0, 1, 100, (3 << 20) // 4 + 7):
            buf = np.arange(count, dtype=np.float32) + 7 if r == root else np.zeros(count, np.float32)
            team.bcast(buf, root=root).wait()
            assert (buf == np.arange(count, dtype=np.float32) + 7).all(), (root, count)
    for _ in range(5):
        team.barrier().wait()
    # the other collectives over the team's point-to-point transport
    for count in (0, 3, 100_001):
        root = n - 1
        out = np.zeros(count)
        team.reduce(np.full(count, r + 1.0), out if r == root else None, root=root).wait()
        if r == root:
            assert (out == n * (n + 1) / 2).all()
        ag = np.zeros(n * count)
        team.allgather(np.full(count, float(r)), ag).wait()
        assert (ag == np.repeat(np.arange(n, dtype=float), count)).all()
        rs = np.zeros(count)
        team.reduce_scatter(np.repeat(np.arange(n, dtype=float), count), rs).wait()
        assert (rs == n * r).all()
        a2a = np.zeros(n * count, np.int32)
        team.alltoall(np.repeat(np.arange(n, dtype=np.int32) + 10 * r, count), a2a).wait()
        assert (a2a == np.repeat(np.arange(n, dtype=np.int32) * 10 + r, count)).all()
        g = np.zeros(n * count, np.int64)
        team.gather(np.full(count, r, np.int64), g if r == 0 else None, root=0).wait()
        if r == 0:
            assert (g == np.repeat(np.arange(n), count)).all()
        sc = np.zeros(count, np.int64)
        whole = np.repeat(np.arange(n, dtype=np.int64), count) if r == root else None
        team.scatter(whole, sc, root=root).wait()
        assert (sc == r).all()
        # tagged calls: never the forms that run on the segment in posting order, at any size
        a2a.fill(-1)
        team.alltoall(np.repeat(np.arange(n, dtype=np.int32) + 10 * r, count), a2a, tag=("a2a", count)).wait()
        assert (a2a == np.repeat(np.arange(n, dtype=np.int32) * 10 + r, count)).all(), "tagged alltoall"
        sc.fill(-1)
        team.scatter(whole, sc, root=root, tag=("scatter", count)).wait()
        assert (sc == r).all(), "tagged scatter"
    # persistent collectives, started three times with refilled buffers
    buf = np.zeros(300_000, np.float32)
    pa = team.allreduce_init(buf)
    bb = np.zeros(1000, np.int16)
    pb = team.bcast_init(bb, root=n - 1)
    pbar = team.barrier_init()
    for run in range(3):
        buf[:] = r + run
        if r == n - 1:
            bb[:] = run + 5
        pycoll.wait_all([pa.start(), pb.start(), pbar.start()])
        assert (buf == sum(rr + run for rr in range(n))).all()
        assert (bb == run + 5).all()


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
