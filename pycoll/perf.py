"""``pycoll perf``: collective benchmarks in the style of UCC's perftest and nccl-tests.

Every size is measured for pycoll and, with ``--compare mpi``, for MPI's own collective in the
same run, alternating rounds so that drift on a shared machine hits both alike. Each rank times
``iters`` back-to-back blocking calls after a barrier; the table shows the mean over ranks of the
per-call time, its min and max over ranks, algbw = size / time and busbw = algbw * factor.

What "size" (the ``bytes`` column; ``count`` is the same in elements, whereas nccl-tests' count
column is per rank for the block collectives) means follows nccl-tests (its doc/PERFORMANCE.md
and src/*.cu), as does the busbw factor, for ``n`` ranks:

================  ==================================================  ==========  ====================
collective        size                                                busbw       MPI (--compare mpi)
================  ==================================================  ==========  ====================
allreduce         the buffer (send = recv)                            2(n-1)/n    Allreduce
bcast             the buffer                                          1           Bcast
reduce            the buffer (send; recv at the root)                 1           Reduce
allgather(v)      recvbuf: the n blocks together (sendbuf = size/n)   (n-1)/n     Allgather(v)
reduce_scatter(v) sendbuf: the n blocks together (recvbuf = size/n)   (n-1)/n     Reduce_scatter_block
                                                                                  / Reduce_scatter
alltoall(v)       sendbuf = recvbuf: the n blocks together            (n-1)/n     Alltoall(v)
gather(v)         recvbuf at the root: n blocks (sendbuf = size/n)    (n-1)/n     Gather(v)
scatter(v)        sendbuf at the root: n blocks (recvbuf = size/n)    (n-1)/n     Scatter(v)
barrier           none: time only (no algbw/busbw; sizes ignored)     -           Barrier
push_pull         the buffer (send = recv)                            2(n-1)/n    Allreduce (workers)
================  ==================================================  ==========  ====================

For the block collectives a nominal size ``S`` gives blocks of ``max(1, S / itemsize // n)``
elements, and the row shows the bytes actually moved (``n`` blocks; sizes that round to the same
blocks are shown once). The v-variants are timed with equal counts (every rank's block the same
size, displacements back to back), against MPI's v-collective given the same counts and
displacements, so they measure the cost of the v machinery next to the block form. With one rank
the (n-1)/n factors are 0, as in nccl-tests.

Several collectives (or ``all``) run one after the other in one launch, a table each; ``--op``
then applies to those that reduce (default sum) and ``--root`` to the rooted ones (default 0),
and either is an error when no named collective takes it.

``push_pull`` is an allreduce (SUM, or AVG as push_pull's mean) through BytePS's push-sum-pull
(:meth:`pycoll.Team.push_pull`, one tensor name per size), over ``n`` workers and the ``--servers K``
summation servers that ``pycoll perf`` starts with them (``pycoll run --servers``; under a launch of
one's own, ``PYCOLL_NUM_SERVERS=K`` makes the last K ranks servers: they serve inside
``Team.from_mpi`` and exit without a table). ``n`` (the ranks column) counts workers; busbw uses
all-reduce's factor so that the two compare, and ``--compare mpi`` times ``MPI_Allreduce`` on a
communicator of the workers only. After its table it prints the traffic per iteration of one worker
and one server (means over each role) at the largest size, counted by the transports on the team
of workers and servers over a loop of its own (messages to oneself left out), next to BytePS's
formula (OSDI'20, section 4.1): with ``L = n^2+kn-2k``, ``M_gpu = (n-k)M/L`` and ``M_cpu = 2(n-1)M/L``,
a worker sends and receives ``M + (n-2)M_gpu`` bytes and a server ``n*M_cpu`` (k = 0: all-reduce's
``2(n-1)M/n``; k >= n or n = 1: a plain PS whose servers share evenly). ``all`` leaves it out.

``--check`` runs each size once more outside the timing, for pycoll and (with ``--compare mpi``)
for MPI, and compares every rank's output with numpy's answer (a barrier is checked by delaying
rank 0: no rank may leave it before rank 0 has entered).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from pycoll import algorithms, calls, perfplot
from pycoll.algorithms.tuning import HIERARCHICAL
from pycoll.collectives import COLLECTIVES, FACTORS, Collective
from pycoll.config import parse_bytes
from pycoll.dtypes import BFLOAT16, KINDS, as_dtype
from pycoll.ops import ReduceOp, as_op, check_op, finish_avg
from pycoll.scaling import rank_counts
from pycoll.team import Team

#: push_pull is no collective of the table (a team method of its own): perf times it as an allreduce.
PUSH_PULL = Collective(
    "push_pull", calls.allreduce, "An allreduce by push-sum-pull.", COLLECTIVES["allreduce"].reference,
    mpi="Allreduce", mpi_params=("sendbuf", "recvbuf", "op"), factor="2(n-1)/n",
    size="the buffer (send = recv); an allreduce by push-sum-pull", reduces=True)
COLLS: Dict[str, Collective] = {**COLLECTIVES, "push_pull": PUSH_PULL}
#: What ``all`` runs: every collective of the table (push_pull, which needs servers and sums only, is
#: run by name).
ALL = tuple(COLLECTIVES)
#: The reductions push_pull can do (a sum, or its mean).
PUSH_PULL_OPS = (ReduceOp.SUM, ReduceOp.AVG)
#: busbw = algbw * BUS_FACTOR[coll](n) (None: barrier, no bandwidth).
BUS_FACTOR: Dict[str, Optional[Callable[[int], float]]] = {c.name: FACTORS[c.factor] for c in COLLS.values()}
ROUNDS = 2
#: The first warm-up (engine, transport, MPI) makes 200 calls of the smallest size, fewer where that
#: would move more than this many bytes per rank.
WARM_BYTES = 256 << 20
#: The default op of a reducing collective.
DEFAULT_OP = "sum"


def describe() -> str:
    """One line per collective: size convention, busbw factor, MPI counterpart (for --help)."""
    lines = [f"  {'collective':<16} {'busbw':<9} {'MPI':<21} size"]
    for c in COLLS.values():
        lines.append(f"  {c.name:<16} {c.factor:<9} {c.mpi or '-':<21} {c.size}")
    return "\n".join(lines)


def selected(colls: Sequence[str]) -> List[str]:
    """The collectives named on the command line (``all``: every one), in order, once each."""
    out: List[str] = []
    for name in colls:
        for c in (ALL if name == "all" else (name,)):
            if c not in COLLS:
                raise ValueError(f"unknown collective {c!r}; known: {', '.join(COLLS)}, all")
            if c not in out:
                out.append(c)
    return out


def validate(args: Any, size: Optional[int] = None) -> List[str]:
    """Check the arguments of ``pycoll perf`` (ValueError with a clear message) before any rank
    starts; returns the collectives to run. ``size``: the number of ranks (default ``args.n``; of
    several rank counts, ``2,4,8``, the smallest)."""
    colls = selected(args.coll if isinstance(args.coll, (list, tuple)) else [args.coll])
    n = size if size is not None else min(rank_counts(args.n)) if isinstance(args.n, str) else args.n
    specs = [COLLS[c] for c in colls]
    dtype = as_dtype(args.dtype)
    reducing = [c.name for c in COLLS.values() if c.reduces]
    rooted = [c.name for c in COLLS.values() if c.rooted]
    if args.op is not None and not any(s.reduces for s in specs):
        raise ValueError(f"--op: {', '.join(colls)} does not reduce (--op applies to {', '.join(reducing)})")
    op = as_op(args.op or DEFAULT_OP)
    for s in specs:
        if s.reduces:
            check_op(op, dtype)
    servers = getattr(args, "servers", None)
    if servers is not None:
        if "push_pull" not in colls:
            raise ValueError(f"--servers: {', '.join(colls)} has no servers (--servers applies to push_pull)")
        if servers < 0:
            raise ValueError(f"--servers must be >= 0, got {servers}")
    if "push_pull" in colls:
        if op not in PUSH_PULL_OPS:
            raise ValueError(f"--op {op.name.lower()}: push_pull sums (--op sum, or avg for the mean)")
        if args.algorithm not in ("auto", "all"):
            raise ValueError(f"--algorithm {args.algorithm}: push_pull has no algorithms to choose "
                             f"(BytePS's placement decides where each part is summed)")
    root = getattr(args, "root", None)
    if root is not None:
        if not any(s.rooted for s in specs):
            raise ValueError(f"--root: {', '.join(colls)} has no root "
                             f"(--root applies to {', '.join(rooted)})")
        if not 0 <= root < n:
            raise ValueError(f"--root {root} is not a rank of {n}")
    if getattr(args, "sizes", None):
        listed(args.sizes, dtype.itemsize)
    else:
        lo, hi = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
        if any(s.factor != "-" for s in specs) and max(lo, dtype.itemsize) > hi:
            raise ValueError(f"--min-bytes {args.min_bytes} is above --max-bytes {args.max_bytes}: no sizes")
    if args.iters < 0 or (args.warmup is not None and args.warmup < 0):
        raise ValueError("--iters and --warmup must be >= 0")
    for s in specs:
        if args.algorithm not in ("auto", "all") and s.name != "push_pull":
            algorithms.get(algorithms_of(s, algorithms.ALGORITHMS), args.algorithm)
        if not callable(getattr(Team, s.name, None)):
            raise ValueError(f"{s.name}: this pycoll's Team has no {s.name}() method")
    if args.compare == "mpi":
        for s in specs:
            if not s.mpi:
                raise ValueError(f"--compare mpi: MPI has no counterpart of {s.name}")
        if dtype == BFLOAT16 and any(s.factor != "-" for s in specs):
            raise ValueError("--compare mpi: MPI has no bfloat16 datatype")
    return colls


def sizes(min_bytes: int, max_bytes: int, itemsize: int) -> List[int]:
    """Element counts from ``min_bytes`` to ``max_bytes``, doubling."""
    out, b = [], max(min_bytes, itemsize)
    while b <= max_bytes:
        out.append(max(1, b // itemsize))
        b *= 2
    return out


def listed(text: str, itemsize: int) -> List[int]:
    """Element counts of the sizes ``text`` lists (``8,4K,64K,1M``: bytes, suffixes K, M, G), in
    increasing order; ValueError for a size that is not one."""
    out = set()
    for part in text.split(","):
        try:
            nbytes = parse_bytes(part.strip())
        except ValueError:
            raise ValueError(f"--sizes {text}: {part!r} is not a size (8, 4K, 64K, 1M...)") from None
        if nbytes < 1:
            raise ValueError(f"--sizes {text}: sizes must be at least 1 byte")
        out.add(max(1, nbytes // itemsize))
    return sorted(out)


def block_counts(spec: Collective, counts: Sequence[int], n: int) -> List[int]:
    """The element counts of the rows of ``spec``: ``counts`` as they are, or for a block
    collective ``n`` blocks of ``max(1, count // n)`` (repeats dropped); ``[0]`` for barrier."""
    if spec.factor == "-":
        return [0]
    if not spec.blocks:
        return list(counts)
    out: List[int] = []
    for c in counts:
        total = max(1, c // n) * n
        if total not in out:
            out.append(total)
    return out


def auto_iters(nbytes: int) -> int:
    """Enough calls for ~20 ms of work at ~5 GB/s, between 10 and 1000. (At least 10: a large
    numpy buffer is madvised for transparent huge pages, and the kernel's khugepaged collapsing
    it stalls the one call that touches it then by 15-40 ms, pycoll's and MPI's alike; averaged
    over 5 calls of 32 MiB that made whole runs look 1.5x slower.)"""
    return int(min(1000, max(10, 100e6 // max(nbytes, 1) // 5 if nbytes else 1000)))


def _input(count: int, dtype: np.dtype, rank: int) -> np.ndarray:
    return ((np.arange(count) % 7) + rank).astype(dtype)


def _same(got: Optional[np.ndarray], want: np.ndarray) -> bool:
    if got is None:
        return False
    if KINDS.get(got.dtype) == "float":
        return bool(np.array_equal(got.astype(np.float64), want.astype(np.float64)))
    return bool(np.array_equal(got, want))


def algorithms_of(spec: Collective, tables: Dict[str, Any]) -> str:
    """The collective whose algorithm table ``--algorithm`` names come from: its own, else (a
    v-variant without a table of its own) the block form's."""
    return spec.name[:-1] if spec.vector and spec.name not in tables else spec.name


_COUNTS = ("counts", "sendcounts", "recvcounts")
_DISPLS = ("displs", "sdispls", "rdispls")


def _case(spec: Collective, env: SimpleNamespace, total: int) -> SimpleNamespace:
    """One row: buffers of ``total`` elements (the size), the pycoll and MPI calls, and checks,
    made from the collective's row of the table (its parameters, buffer shapes, root-only
    buffers, MPI method and numpy reference).

    ``check_pycoll()`` / ``check_mpi()`` clear the outputs, run the call once and say whether this
    rank's output is numpy's answer."""
    team, comm, n, rank, dtype = env.team, env.comm, env.n, env.rank, env.dtype
    op, root, algorithm = env.op, env.root, env.algorithm
    m = total // n if spec.blocks else total  # one block
    counts = [m] * n
    displs = [i * m for i in range(n)]
    inputs = [_input(m if spec.send == "block" else total, dtype, r) for r in range(n)]
    want = spec.reference(inputs, rank, n, op, root)  # None: nothing to check on this rank
    here = {"root": root, "op": op}

    def array(count: int, value: Optional[np.ndarray] = None) -> np.ndarray:
        # --alloc: in memory every rank maps (team.alloc: collective, so every rank makes each)
        a = team.alloc(count, dtype) if env.alloc else np.empty(count, dtype)
        if value is not None:
            a[:] = value
        return a

    for p in spec.params:  # pycoll's arguments, by name
        if p in spec.root_only and rank != root:
            here[p] = None
            if env.alloc and p in ("sendbuf", "recvbuf"):  # (the root's alloc is collective)
                array(len(inputs[rank]) if p == "sendbuf" else m if spec.recv == "block" else total)
        elif p == "buf":
            here[p] = array(total, inputs[root] if rank == root else None)
        elif p == "sendbuf":
            here[p] = array(len(inputs[rank]), inputs[rank]) if env.alloc else inputs[rank]
        elif p == "recvbuf":
            here[p] = array(m if spec.recv == "block" else total)
        elif p in _COUNTS:
            here[p] = counts
        elif p in _DISPLS:
            here[p] = displs
    out = here.get("recvbuf", here.get("buf"))  # this rank's output (None: none here)
    outs = [] if out is None or (spec.name == "bcast" and rank == root) else [out]
    fix_avg = op is ReduceOp.AVG  # MPI sums: divide its result as pycoll does
    mpi_args = []
    for p in spec.mpi_params:
        value = here.get(spec.mpi_rename.get(p, p))
        if p == "op":
            value = env.mpi_op
        elif p in spec.mpi_vector and value is not None:
            value = [value, counts, displs, env.mpi_type]
        mpi_args.append(value)
    mpi_call = getattr(comm, spec.mpi) if spec.mpi else None
    py: Callable[[], Any]
    if spec is PUSH_PULL:
        send, recv = here["sendbuf"], here["recvbuf"]
        tensor, average = f"perf:{total}", op is ReduceOp.AVG  # one name per size: a name keeps its layout

        def py() -> Any:
            return team.push_pull(send, recv, name=tensor, average=average).wait()
    else:
        start = getattr(team, spec.name)
        args = [here[p] for p in spec.params]

        def py() -> Any:
            return start(*args, algorithm=algorithm).wait()

    def mp() -> Any:
        return mpi_call(*mpi_args)

    def check(call: Callable[[], Any], is_mpi: bool) -> bool:
        if spec.name == "barrier":
            return _check_barrier(call, comm, rank)
        for o in outs:
            o.fill(0)
        comm.Barrier()
        call()
        if want is None:
            return True
        got = out
        if is_mpi and fix_avg and got is not None:
            got = got.copy()
            finish_avg(got, n)
        return _same(got, want)

    return SimpleNamespace(count=total, nbytes=total * dtype.itemsize, py=py, mpi=mp,
                           check_pycoll=lambda: check(py, False), check_mpi=lambda: check(mp, True))


def _every(comm: Any, value: float) -> List[float]:
    """Every rank's ``value`` (MPI's buffer Allgather)."""
    out = np.empty(comm.Get_size())
    comm.Allgather(np.array([value]), out)
    return out.tolist()


def _all_true(comm: Any, flag: bool) -> bool:
    """Whether ``flag`` holds on every rank."""
    from mpi4py import MPI  # noqa: PLC0415 - (perf runs under MPI only)

    out = np.empty(1, np.int32)
    comm.Allreduce(np.array([int(bool(flag))], np.int32), out, op=MPI.MIN)
    return bool(out[0])


def _check_barrier(call: Callable[[], Any], comm: Any, rank: int, delay: float = 0.02) -> bool:
    """Rank 0 enters ``delay`` s late; a rank that leaves before rank 0 entered (allowing 5 ms of
    clock skew) shows a barrier that does not wait."""
    comm.Barrier()
    entered = 0.0
    if rank == 0:
        time.sleep(delay)
        entered = time.time()
    call()
    left = time.time()
    at = np.array([entered])
    comm.Bcast(at, root=0)  # (MPI's buffer calls throughout: mpi4py's lowercase ones pickle)
    return left >= float(at[0]) - 0.005


def run(args: Any) -> int:
    """Benchmark under MPI (every rank runs this)."""
    from mpi4py import MPI  # noqa: PLC0415 - importing mpi4py.MPI initialises MPI: only under the launcher

    # with PYCOLL_NUM_SERVERS=K the last K ranks are push_pull's servers: they serve in here and
    # leave with SystemExit(0) once the workers are done (no table); the workers time and compare
    # on a communicator of the workers only (the one the team split off by role)
    team = Team.from_mpi(MPI.COMM_WORLD)
    comm = team.comm.Dup() if team.ps.roles is not None else MPI.COMM_WORLD
    try:
        return _run(args, team, comm, MPI)
    finally:
        if comm is not MPI.COMM_WORLD:
            comm.Free()
            team.close()  # says goodbye: the servers exit


def usable_algorithms(team: Any, spec: Collective, alloc: bool = False) -> List[str]:
    """``auto`` and every algorithm of ``spec`` that can run on ``team`` (``--algorithm all``):
    ``shm`` needs the team's segment, ``cma`` one whose ranks may read each other's memory,
    ``mapped`` arrays of ``team.alloc`` (``alloc``), the hierarchical ones a team spanning nodes;
    push_pull has none to choose."""
    if spec.name == "push_pull":
        return ["auto"]
    seg = team.shared
    names = ["auto"]
    for name in algorithms.ALGORITHMS[algorithms_of(spec, algorithms.ALGORITHMS)]:
        if (name == "shm" and seg is None) or (name == "cma" and (seg is None or not seg.cma)):
            continue
        if name == "mapped" and (seg is None or not alloc):  # (arrays of team.alloc only)
            continue
        if name in HIERARCHICAL and not team.hierarchical:
            continue
        names.append(name)
    return names


def _run(args: Any, team: Any, comm: Any, MPI: Any) -> int:  # noqa: N803 - mpi4py's name
    n, rank = team.size, team.rank
    try:
        colls = validate(args, n)
    except ValueError as exc:
        if rank == 0:
            print(f"pycoll perf: {exc}", file=sys.stderr, flush=True)
        return 2
    dtype = as_dtype(args.dtype)
    op = as_op(args.op or DEFAULT_OP)
    mpi_type = None
    if args.compare == "mpi" and dtype != BFLOAT16:
        from mpi4py.util.dtlib import from_numpy_dtype  # noqa: PLC0415 - imports mpi4py.MPI

        mpi_type = from_numpy_dtype(dtype)
    counts = (listed(args.sizes, dtype.itemsize) if getattr(args, "sizes", None) else
              sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), dtype.itemsize))
    rows: List[Dict[str, Any]] = []
    metas: List[Dict[str, Any]] = []
    status = 0
    for coll in colls:
        spec = COLLS[coll]
        names = (usable_algorithms(team, spec, bool(getattr(args, "alloc", False))) if args.algorithm == "all"
                 else [args.algorithm])
        for name in names:
            env = SimpleNamespace(team=team, comm=comm, n=n, rank=rank, dtype=dtype, op=op,
                                  mpi_op=getattr(MPI, "SUM" if op is ReduceOp.AVG else op.name),
                                  root=args.root or 0, mpi_mod=MPI, mpi_type=mpi_type,
                                  algorithm=None if name == "auto" else name,
                                  alloc=bool(getattr(args, "alloc", False)))
            got, meta = _run_one(spec, env, SimpleNamespace(**{**vars(args), "algorithm": name}), counts)
            rows.extend(got)
            metas.append(meta)
            if got and "error" in got[-1]:
                status = 2
    if rank == 0 and args.json:
        meta = dict(metas[0])
        if len(metas) > 1:  # what differs by collective goes under "colls"
            meta = {k: v for k, v in meta.items() if k not in _PER_COLL}
            meta["coll"] = ",".join(colls)
            meta["colls"] = {m["coll"]: {k: m[k] for k in _PER_COLL if k != "coll" and k in m} for m in metas}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if rank == 0 and getattr(args, "plot", None):
        for path in perfplot.plot(rows, metas, args.plot):
            print(f"# plot: {path}", flush=True)
    failed = any(r.get("check") == "WRONG" or r.get("mpi_check") == "WRONG" for r in rows)
    return status or (1 if failed else 0)


_PER_COLL = ("coll", "op", "root", "bus_factor", "factor", "size", "mpi", "servers", "traffic")


def byteps_traffic(n: int, k: int, nbytes: int) -> Dict[str, Any]:
    """BytePS's traffic per iteration (OSDI'20, section 4.1) of an ``nbytes`` push-sum-pull over
    ``n`` workers and ``k`` CPU servers: ``m_gpu`` and ``m_cpu`` are the bytes summed by each
    colocated service and each server; a worker sends and receives ``worker`` bytes, ``M - m_gpu``
    for its own pushes and pulls plus ``(n-1)*m_gpu`` for its service, a server ``n*m_cpu``
    (``server`` None without servers). Outside BytePS's range (``k > n``, or ``n = 1`` with servers)
    it is a plain PS whose servers share the model evenly."""
    m = float(nbytes)
    if k and (k > n or n == 1):
        m_gpu, m_cpu = 0.0, m / k
    else:
        total = n * n + k * n - 2 * k
        m_gpu, m_cpu = (n - k) * m / total, 2 * (n - 1) * m / total
    return {"m_gpu": m_gpu, "m_cpu": m_cpu if k else None, "worker": m + (n - 2) * m_gpu,
            "server": n * m_cpu if k else None}


def role_traffic(team: Any, comm: Any, call: Callable[[], Any], nbytes: int,
                 iters: int = 1) -> Dict[str, Any]:
    """Bytes per iteration that a worker and a server send and receive (means over the role) in
    ``iters`` calls of ``call`` (a push_pull of ``nbytes``), counted by the transports of the team of
    workers and servers (``team.ps.roles.world``; the team itself without servers), messages to oneself
    left out, next to :func:`byteps_traffic`. Collective over the workers (``comm``: theirs).

    The servers cannot be asked (they run their loop), but every byte they move goes to or comes
    from a worker: a server's received bytes are the bytes the workers sent to it, its sent bytes
    the bytes they received from it."""
    roles = team.ps.roles
    n, k = team.size, (roles.k if roles is not None else 0)
    world = roles.world if roles is not None else team
    iters = max(1, iters)
    comm.Barrier()
    world.reset_traffic()  # after this rank's earlier calls completed: nothing of theirs is left to count
    for _ in range(iters):
        call()
    t = world.traffic(include_self=False)
    mine = np.array([t["total"]["sent"], t["total"]["received"],
                     *(t[n + s][way] for s in range(k) for way in ("sent", "received"))], np.int64)
    rows = np.empty((comm.Get_size(), mine.size), np.int64)
    comm.Allgather(mine, rows)
    every = [(int(w[0]), int(w[1]), [(int(w[2 + 2 * s]), int(w[3 + 2 * s])) for s in range(k)]) for w in rows]
    formula = byteps_traffic(n, k, nbytes)
    out: Dict[str, Any] = {"bytes": nbytes, "iters": iters, "workers": n, "servers": k,
                           "m_gpu": formula["m_gpu"], "m_cpu": formula["m_cpu"], "server": None}
    out["worker"] = {"sent": float(np.mean([w[0] for w in every])) / iters,
                     "received": float(np.mean([w[1] for w in every])) / iters, "formula": formula["worker"]}
    if k:
        server_recv = [sum(w[2][s][0] for w in every) for s in range(k)]
        server_sent = [sum(w[2][s][1] for w in every) for s in range(k)]
        out["server"] = {"sent": float(np.mean(server_sent)) / iters,
                         "received": float(np.mean(server_recv)) / iters, "formula": formula["server"]}
    return out


def print_traffic(tr: Dict[str, Any]) -> None:
    """Print :func:`role_traffic`'s figures: a line per role and the formula."""
    n, k, m = tr["workers"], tr["servers"], tr["bytes"]
    print(f"# traffic per iteration at M = {m} B: means over {n} worker{'s' if n != 1 else ''}"
          + (f" and {k} server{'s' if k != 1 else ''}" if k else "")
          + f", {tr['iters']} iteration{'s' if tr['iters'] != 1 else ''} counted on the team of workers and "
          "servers (messages to oneself left out)")
    print(f"# {'role':<8} {'sent_B':>14} {'recv_B':>14} {'formula_B':>14} {'sent/formula':>12} "
          f"{'recv/formula':>12}")
    for role in ("worker", "server"):
        r = tr[role]
        if r is None:
            continue
        f = r["formula"]
        sent, recv = ((f"{r[x] / f:>12.4f}" if f else f"{'-':>12}") for x in ("sent", "received"))
        print(f"# {role:<8} {r['sent']:>14.0f} {r['received']:>14.0f} {f:>14.0f} {sent} {recv}")
    line = f"# formula (BytePS section 4.1): worker M+(n-2)*M_gpu, M_gpu = {tr['m_gpu']:.0f} B"
    if k:
        line += f"; server n*M_cpu, M_cpu = {tr['m_cpu']:.0f} B"
    if k and (k > n or n == 1):
        line += " (a plain PS: the servers share M evenly)"
    else:
        line += f" (L = n^2+kn-2k = {n * n + k * n - 2 * k}: M_gpu = (n-k)M/L"
        line += ", M_cpu = 2(n-1)M/L)" if k else ")"
    print(line)


def _run_one(spec: Collective, env: SimpleNamespace, args: Any, counts: List[int]) -> tuple:
    """Measure one collective at every size; rank 0 prints its table. Returns (rows, meta)."""
    team, comm, n, rank, dtype = env.team, env.comm, env.n, env.rank, env.dtype
    MPI = env.mpi_mod  # noqa: N806 - mpi4py's name
    compare = args.compare == "mpi"
    factor = spec.bus_factor(n)
    rows: List[Dict[str, Any]] = []
    meta = {"coll": spec.name, "ranks": n, "dtype": str(dtype), "op": env.op.name.lower() if spec.reduces
            else None, "root": env.root if spec.rooted else None, "algorithm": args.algorithm,
            "bus_factor": factor, "factor": spec.factor, "size": spec.size,
            "mpi": spec.mpi if compare else None,
            "transport": _transports(team), "machine": platform.node(), "cpus": _cpus(),
            "python": platform.python_version(), "time": time.time()}
    servers = None
    if spec.name == "push_pull":
        servers = meta["servers"] = team.ps.roles.k if team.ps.roles is not None else 0
    if rank == 0:
        what = f"{n} ranks" if servers is None else \
            f"{n} workers, {servers} server{'s' if servers != 1 else ''}"
        what += f", {dtype}" if factor is not None else ""
        if spec.reduces:
            what += f", op {env.op.name.lower()}"
        what += f", algorithm {args.algorithm}"
        if spec.rooted:
            what += f", root {env.root}"
        print(f"# pycoll perf {spec.name}: {what}, transport {_transports(team)}, machine "
              f"{platform.node()} ({platform.machine()}, {_cpus()} cpus)")
        if factor is None:
            print(f"# {spec.name} moves no data: time only" + (f"; MPI: {spec.mpi}" if compare else ""))
        else:
            print(f"# size = {spec.size}; algbw = size / time; busbw = algbw * {spec.factor} = "
                  f"algbw * {factor:.3f} (nccl-tests)" + (f"; MPI: {spec.mpi}" if compare else ""))
        if compare:
            print("# vs_mpi = mpi_us / avg_us (> 1: pycoll faster)")
        head = f"{'count':>10} {'bytes':>10} {'avg_us':>10} {'min_us':>10} {'max_us':>10} " \
               f"{'algbw':>7} {'busbw':>7}"
        if compare:
            head += f" | {'mpi_us':>10} {'mpi_algbw':>9} {'vs_mpi':>6}"
        print(head + ("  check" if args.check else ""))
        print(f"{'':>10} {'':>10} {'':>10} {'':>10} {'':>10} {'GB/s':>7} {'GB/s':>7}"
              + (f" | {'':>10} {'GB/s':>9} {'x':>6}" if compare else ""))
        sys.stdout.flush()
    totals = block_counts(spec, counts, n)
    # warm up the engine, the transport and MPI once before anything is timed; a type or op that
    # MPI rejects shows here (on every rank alike) and ends this collective with a clear error
    warm = _case(spec, env, totals[0])
    try:
        for _ in range(min(200, max(2, WARM_BYTES // max(1, warm.nbytes)))):
            warm.py()
            if compare:
                warm.mpi()
    except MPI.Exception as exc:
        lines = [x.split("): ")[-1].strip() for x in str(exc).splitlines() if x.strip()]
        why = lines[0].removesuffix(":").removesuffix(", error stack")
        if len(lines) > 1:
            why += f" ({lines[-1]})"
        if rank == 0:
            print(f"pycoll perf: MPI's {spec.mpi} rejects {dtype}"
                  + (f" with op {env.op.name.lower()}" if spec.reduces else "")
                  + f": {why} (run without --compare mpi)", file=sys.stderr, flush=True)
        return [{"coll": spec.name, "error": why}], meta
    for i, total in enumerate(totals):
        case = _case(spec, env, total)
        nbytes = case.nbytes
        iters = args.iters or auto_iters(nbytes)
        warmup = args.warmup if args.warmup is not None else max(2, min(10, iters // 10))
        if rank == 0 and (nbytes >= 1 << 20 or i % 8 == 0):
            print(f"pycoll perf: {spec.name} {nbytes} B ({i + 1}/{len(totals)})", file=sys.stderr, flush=True)
        row: Dict[str, Any] = {"coll": spec.name, "algorithm": args.algorithm, "count": case.count,
                               "bytes": nbytes, "iters": iters}
        ok = ""
        if args.check:
            row["check"] = "ok" if _all_true(comm, case.check_pycoll()) else "WRONG"
            if compare:
                row["mpi_check"] = "ok" if _all_true(comm, case.check_mpi()) else "WRONG"
            bad = [w for w, k in (("WRONG", "check"), ("MPI_WRONG", "mpi_check")) if row.get(k) == "WRONG"]
            ok = "  " + (",".join(bad) if bad else "ok")
        t_py, t_mpi = [], []
        for _ in range(ROUNDS):
            t_py.append(_time(case.py, iters, warmup, comm))
            if compare:
                t_mpi.append(_time(case.mpi, iters, warmup, comm))
        times = _every(comm, float(np.mean(t_py)))
        row.update(avg_us=float(np.mean(times)) * 1e6, min_us=min(times) * 1e6, max_us=max(times) * 1e6)
        row["algbw"] = _bw(nbytes, row["avg_us"]) if factor is not None else None
        row["busbw"] = row["algbw"] * factor if factor is not None else None
        if compare:
            mpi_times = _every(comm, float(np.mean(t_mpi)))
            row["mpi_us"] = float(np.mean(mpi_times)) * 1e6
            row["mpi_algbw"] = _bw(nbytes, row["mpi_us"]) if factor is not None else None
            row["vs_mpi"] = row["mpi_us"] / row["avg_us"] if row["avg_us"] else 0.0
        rows.append(row)
        if rank == 0:
            line = f"{case.count:>10} {nbytes:>10} {row['avg_us']:>10.2f} {row['min_us']:>10.2f} " \
                   f"{row['max_us']:>10.2f} {_fmt(row['algbw'], 7)} {_fmt(row['busbw'], 7)}"
            if compare:
                line += f" | {row['mpi_us']:>10.2f} {_fmt(row['mpi_algbw'], 9)} {row['vs_mpi']:>6.2f}"
            print(line + ok, flush=True)
    if servers is not None and totals:  # push_pull: traffic per role at the largest size
        traffic = meta["traffic"] = role_traffic(team, comm, case.py, case.nbytes, iters)
        if rank == 0:
            print_traffic(traffic)
    if rank == 0:
        print(flush=True)
    return rows, meta


def _bw(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9 if us else 0.0


def _fmt(value: Optional[float], width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.3f}"


def _transports(team: Any) -> str:
    return f"shm+{team.transport.name}" if getattr(team, "shared", None) is not None else team.transport.name


def _time(call: Callable[[], None], iters: int, warmup: int, comm: Any) -> float:
    for _ in range(warmup):
        call()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def _cpus() -> Optional[int]:
    return os.cpu_count()
