"""Soak: many random collectives on one team, each checked against numpy, and the process's
memory, open files and threads watched from the first tenth of the calls to the last.

Every rank draws the same sequence from one seed: the collective (allreduce, reduce, bcast,
allgather(v), reduce_scatter, alltoall(v), gather, scatter, barrier), its size (0 B to
``--max-bytes``, log-uniform), dtype, op, root, whether it is tagged and whether it runs as a
persistent collective (``*_init``, started twice). Inputs are small integers, so every reduction
is exact in any order. Rank 0 prints the calls by kind, the wrong ones (there must be none), and
RSS (the median of readings every ``--sample`` calls over the twentieth of the calls that ends at the
first tenth, against that of the last twentieth), open files and threads; the exit status is 1 on a
wrong result, or on growth past ``--max-rss-growth`` or of files or threads. ``--mpi`` runs the same
calls through MPI's own collectives: the baseline of what the process's own allocations do.

The soak fixes glibc's mmap threshold at 128 KiB (``--mmap-threshold``; glibc's own moving one with
``--mmap-threshold 0``): then RSS follows the memory in use, not the largest the heap ever was.

    pycoll run -n 4 -- python benchmarks/soak.py                      # 10,000 calls, the segment
    PYCOLL_TLS=mpi pycoll run -n 4 -- python benchmarks/soak.py       # MPI's point to point
    pycoll run -n 4 -- python benchmarks/soak.py --quick              # 400 calls up to 256 KiB
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading
import tracemalloc
from collections import Counter
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
from mpi4py import MPI

from pycoll import Team
from pycoll.config import parse_bytes

DTYPES = (np.float32, np.float64, np.int32, np.int64)
OPS = ("sum", "max", "min")
KINDS = ("allreduce", "reduce", "bcast", "allgather", "allgatherv", "reduce_scatter", "alltoall",
         "alltoallv", "gather", "scatter", "barrier")
NP_OPS = {"sum": np.add.reduce, "max": np.maximum.reduce, "min": np.minimum.reduce}


def data(rank: int, count: int, dtype: Any, salt: int) -> np.ndarray:
    """Rank ``rank``'s input: small integers (exact sums in any order), different per rank."""
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 3 + salt) % 11 - 5).astype(dtype)


def usage(trim: bool = False) -> Tuple[int, int, int]:
    """(resident bytes, open files, threads) of this process; ``trim``: first hand the memory glibc's
    allocator keeps free for reuse back to the system (``malloc_trim(0)``), so that RSS counts what
    is in use."""
    if trim:
        ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    threads = max(threading.active_count(), len(os.listdir("/proc/self/task")))
    return rss, len(os.listdir("/proc/self/fd")), threads


def resident_kinds() -> Dict[str, int]:
    """This process's resident memory by kind (bytes): ``anon`` (heap, anonymous maps: Python,
    numpy, the allocators' arenas), ``shmem`` (shared memory it touched: pycoll's segment and
    MPICH's), ``file`` (mapped files: libraries)."""
    kinds = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem"):
                kinds[name[3:].lower()] = int(value.split()[0]) * 1024
    return kinds


class MpiCalls:
    """The collectives the soak calls, run by MPI's own (mpi4py on ``comm``) instead of pycoll's:
    the same calls and the same allocations, for the baseline of memory growth (``--mpi``). Tags
    are ignored; a persistent call runs twice, as the soak starts it."""

    _OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}

    class _Done:
        def wait(self) -> None:
            pass

        def start(self) -> MpiCalls._Done:
            return self

    def __init__(self, comm: Any) -> None:
        self.comm, self.size, self.rank = comm, comm.size, comm.rank

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if not name.endswith("_init"):
            raise AttributeError(name)
        method = getattr(self, name[:-5])

        def init(*args: Any, **kw: Any) -> Any:
            ran = MpiCalls._Done()
            ran.start = lambda: (method(*args, **kw), ran)[1]  # type: ignore[method-assign]
            return ran
        return init

    def allreduce(self, src: Any, dst: Any = None, op: str = "sum", **_: Any) -> Any:
        self.comm.Allreduce(MPI.IN_PLACE if dst is None else src, src if dst is None else dst, self._OPS[op])
        return self._Done()

    def reduce(self, src: Any, out: Any, op: str, root: int, **_: Any) -> Any:
        self.comm.Reduce(src, out, self._OPS[op], root)
        return self._Done()

    def bcast(self, buf: Any, root: int, **_: Any) -> Any:
        self.comm.Bcast(buf, root)
        return self._Done()

    def allgather(self, src: Any, out: Any, **_: Any) -> Any:
        self.comm.Allgather(src, out)
        return self._Done()

    def allgatherv(self, src: Any, out: Any, counts: List[int], **_: Any) -> Any:
        self.comm.Allgatherv(src, (out, counts))
        return self._Done()

    def reduce_scatter(self, src: Any, out: Any, op: str, **_: Any) -> Any:
        self.comm.Reduce_scatter_block(src, out, self._OPS[op])
        return self._Done()

    def alltoall(self, src: Any, out: Any, **_: Any) -> Any:
        self.comm.Alltoall(src, out)
        return self._Done()

    def alltoallv(self, src: Any, out: Any, send_counts: List[int], recv_counts: List[int],
                  sdispls: List[int], **_: Any) -> Any:
        self.comm.Alltoallv((src, (send_counts, sdispls)), (out, recv_counts))
        return self._Done()

    def gather(self, src: Any, out: Any, root: int, **_: Any) -> Any:
        self.comm.Gather(src, out, root)
        return self._Done()

    def scatter(self, src: Any, out: Any, root: int, **_: Any) -> Any:
        self.comm.Scatter(src, out, root)
        return self._Done()

    def barrier(self, **_: Any) -> Any:
        self.comm.Barrier()
        return self._Done()

    def close(self) -> None:
        pass


def one_call(team: Team, rng: np.random.Generator, i: int, max_count: int,
             kinds: Tuple[str, ...] = KINDS) -> Tuple[str, Callable[[], bool]]:
    """Draw call ``i`` (the same draw on every rank) among ``kinds`` and return its name and a
    function that runs it and says whether this rank's output is numpy's."""
    n, r = team.size, team.rank
    kind = kinds[rng.integers(len(kinds))]
    dtype = DTYPES[rng.integers(len(DTYPES))]
    op = OPS[rng.integers(len(OPS))]
    root = int(rng.integers(n))
    count = int(np.exp(rng.uniform(0, np.log(max_count + 1)))) - 1  # log-uniform, 0 included
    tag = ("soak", i) if rng.random() < 0.3 else None
    persistent = rng.random() < 0.2 and tag is None
    blocks = [int(c) for c in rng.integers(0, count // n + 2, size=n)]  # the v-forms' counts
    ins = [data(q, count, dtype, i) for q in range(n)]
    name = f"{kind}{' tagged' if tag else ''}{' persistent' if persistent else ''}"
    kw = {} if tag is None else {"tag": tag}

    def run(method: str, *args: Any, **more: Any) -> None:
        if persistent:
            p = getattr(team, f"{method}_init")(*args, **more)
            p.start().wait()
            p.start().wait()  # twice: the second run rebinds nothing and must give the same
        else:
            getattr(team, method)(*args, **more, **kw).wait()

    def check() -> bool:
        if kind == "allreduce":  # in place, but for a persistent one (its second run would reduce again)
            buf = np.zeros(count, dtype) if persistent else ins[r].copy()
            run("allreduce", ins[r] if persistent else buf, buf if persistent else None, op)
            return np.array_equal(buf, NP_OPS[op](np.stack(ins)) if count else buf)
        if kind == "reduce":
            out = np.empty(count, dtype) if r == root else None
            run("reduce", ins[r], out, op, root)
            return r != root or np.array_equal(out, NP_OPS[op](np.stack(ins)) if count else out)
        if kind == "bcast":
            buf = ins[root].copy() if r == root else np.zeros(count, dtype)
            run("bcast", buf, root)
            return np.array_equal(buf, ins[root])
        if kind == "allgather":
            m = count // n
            out = np.zeros(n * m, dtype)
            run("allgather", ins[r][:m], out)
            return np.array_equal(out, np.concatenate([x[:m] for x in ins]))
        if kind == "allgatherv":
            out = np.zeros(sum(blocks), dtype)
            mine = [data(q, blocks[q], dtype, i) for q in range(n)]
            run("allgatherv", mine[r], out, blocks)
            return np.array_equal(out, np.concatenate(mine))
        if kind == "reduce_scatter":
            m = count // n
            out = np.zeros(m, dtype)
            run("reduce_scatter", ins[r][:n * m], out, op)
            whole = NP_OPS[op](np.stack([x[:n * m] for x in ins])) if m else np.zeros(0, dtype)
            return np.array_equal(out, whole[r * m:(r + 1) * m])
        if kind == "alltoall":
            m = count // n
            out = np.zeros(n * m, dtype)
            run("alltoall", ins[r][:n * m], out)
            return np.array_equal(out, np.concatenate([x[r * m:(r + 1) * m] for x in ins]))
        if kind == "alltoallv":
            # rank q sends rank p the first (q + p + c) % (m + 1) elements of its p-th slice of m
            m = max(1, count // n)
            send_counts = [(r + p + i) % (m + 1) for p in range(n)]
            recv_counts = [(q + r + i) % (m + 1) for q in range(n)]
            src = [data(q, n * m, dtype, i) for q in range(n)]
            out = np.zeros(sum(recv_counts), dtype)
            sdispls = [p * m for p in range(n)]
            run("alltoallv", src[r], out, send_counts, recv_counts, sdispls)
            want = [src[q][r * m:r * m + recv_counts[q]] for q in range(n)]
            return np.array_equal(out, np.concatenate(want))
        if kind == "gather":
            m = count // n
            out = np.zeros(n * m, dtype) if r == root else None
            run("gather", ins[r][:m], out, root)
            return r != root or np.array_equal(out, np.concatenate([x[:m] for x in ins]))
        if kind == "scatter":
            m = count // n
            out = np.zeros(m, dtype)
            run("scatter", ins[root][:n * m] if r == root else None, out, root)
            return np.array_equal(out, ins[root][r * m:(r + 1) * m])
        run("barrier")
        return True

    return name, check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--max-bytes", default="4M", help="largest buffer (float64: a quarter as many elements)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(KINDS), help="the collectives to draw from (comma-separated)")
    ap.add_argument("--max-rss-growth", type=float, default=0.10, help="from the first tenth to the end")
    ap.add_argument("--quick", action="store_true",
                    help="400 calls up to 256 KiB, RSS growth up to 50%% (what the test runs)")
    ap.add_argument("--trim", action="store_true",
                    help="call glibc's malloc_trim(0) before each reading: RSS without the free memory "
                         "the allocator keeps")
    ap.add_argument("--sample", type=int, default=10, help="read RSS every this many calls")
    ap.add_argument("--mmap-threshold", default="128K",
                    help="fix glibc's mmap threshold at this size (0: glibc's own, which moves; see main)")
    ap.add_argument("--every", type=int, default=0,
                    help="print rank 0's RSS (and the call) every this many calls: where it grows")
    ap.add_argument("--mpi", action="store_true",
                    help="run the same calls through MPI's own collectives (mpi4py): the baseline "
                         "of memory growth")
    ap.add_argument("--trace-memory", action="store_true",
                    help="rank 0 prints where Python's allocations (numpy's included) grew from the first "
                         "tenth to the end (tracemalloc; slower)")
    args = ap.parse_args()
    if args.mmap_threshold:
        # glibc's M_MMAP_THRESHOLD (-3), as MALLOC_MMAP_THRESHOLD_ sets it: fixed, so that every array
        # of at least this size is mapped on its own and unmapped when freed. By default glibc raises
        # the threshold to the largest block freed so far (up to 32 MiB), and serves the 4 MiB arrays
        # of later calls from its heap, which then stays as large as its fullest moment
        ctypes.CDLL(None).mallopt(-3, parse_bytes(args.mmap_threshold))
    if args.quick:  # (the pools of finished collectives and remembered calls still fill: RSS is not flat yet)
        args.calls, args.max_bytes, args.max_rss_growth = 400, "256K", 0.5
    world = MPI.COMM_WORLD
    team = MpiCalls(world) if args.mpi else Team.from_mpi(world)
    rng = np.random.default_rng(args.seed)
    max_count = parse_bytes(args.max_bytes) // 8
    kinds_drawn = tuple(args.kinds.split(","))
    if not set(kinds_drawn) <= set(KINDS):
        ap.error(f"--kinds: choose among {', '.join(KINDS)}")
    kinds: Counter = Counter()
    wrong: List[str] = []
    # RSS is read every --sample calls, after the call's arrays are dropped; the growth compares the
    # median of the readings of the window of calls ending at the first tenth with that of the last
    # window (a single reading swings by the largest arrays the allocator happens to keep)
    n = args.calls
    mark, window = n // 10, max(1, n // 20)
    early: List[int] = []
    late: List[int] = []
    first = None
    if args.trace_memory:
        tracemalloc.start(8)
    for i in range(n):
        name, check = one_call(team, rng, i, max_count, kinds_drawn)
        kinds[name.split()[0]] += 1
        if not check():
            wrong.append(f"call {i}: {name}")
        del check
        if i % args.sample == 0 or i in (mark, n - 1):
            rss = usage(args.trim)[0]
            if mark - window < i <= mark:
                early.append(rss)
            if i >= n - window:
                late.append(rss)
        if args.every and i % args.every == 0 and world.rank == 0:
            print(f"call {i}: RSS {usage(args.trim)[0] / 2**20:.1f} MiB after {name}", flush=True)
        if i == mark:
            first = usage(args.trim)
            kinds0 = resident_kinds()
            if args.trace_memory:
                snap0 = tracemalloc.take_snapshot()
    last = usage(args.trim)
    kinds1 = resident_kinds()
    if args.trace_memory and world.rank == 0 and tracemalloc.is_tracing():
        grown = tracemalloc.take_snapshot().compare_to(snap0, "traceback")
        print(f"Python allocations grown from call {args.calls // 10} to the end: "
              f"{sum(d.size_diff for d in grown) / 2**20:+.1f} MiB; the largest:")
        for d in grown[:8]:
            print(f"  {d.size_diff / 2**20:+.2f} MiB in {d.count_diff:+d} blocks at\n    "
                  + "\n    ".join(str(f) for f in d.traceback.format()[-8::2]))
    wrong_all = world.gather(wrong)
    team.close()
    if world.rank != 0:
        return
    bad = [w for ws in wrong_all for w in ws]
    _, files0, threads0 = first or last
    _, files1, threads1 = last
    rss0, rss1 = float(np.median(early or [last[0]])), float(np.median(late or [last[0]]))
    growth = rss1 / rss0 - 1
    who = " (MPI's own collectives)" if args.mpi else ""
    print(f"soak{who}: {args.calls} collectives on {world.size} ranks (seed {args.seed}, "
          f"up to {args.max_bytes}): "
          + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    print(f"wrong: {len(bad)}" + (": " + "; ".join(bad[:10]) if bad else ""))
    mib = [f"{x / 2**20:.1f}" for x in (rss0, rss1, min(early), min(late), max(early), max(late))]
    print(f"rank 0, median RSS of calls {mark - window + 1}-{mark} -> of the last {window}: {mib[0]} -> "
          f"{mib[1]} MiB ({growth:+.1%}; lowest {mib[2]} -> {mib[3]}, highest {mib[4]} -> {mib[5]}); "
          f"open files {files0} -> {files1}, threads {threads0} -> {threads1}")
    if first is not None:
        print("  by kind: " + ", ".join(f"{k} {kinds0[k] / 2**20:.1f} -> {kinds1[k] / 2**20:.1f} MiB"
                                        for k in kinds1))
    leaked = growth > args.max_rss_growth or files1 > files0 or threads1 > threads0
    raise SystemExit(1 if bad or leaked else 0)


if __name__ == "__main__":
    main()
