"""``pycoll sim calibrate``: this host's parameters for the simulator, measured, written as a
machine file (:mod:`pycoll.sim.machine`).

Two ranks (launched as ``pycoll run`` does) on the point-to-point transport the collectives'
programs use (``PYCOLL_TLS``, ``mpi`` where unset) run ``--steps`` ping-pongs, each message
posted and polled from Python as a collective's step is: half a round trip at 8 B is ``alpha``
(what a message costs, Python included); ping-pongs of 1 KiB-256 KiB find the size from which
messages pay a protocol's extra latency (MPI's rendezvous: ``rendezvous_bytes``, ``rendezvous``);
both ranks sending 4 MiB at once, as a recursive-doubling step does, give the ``bandwidth``.
numpy's reduction (``np.add`` into a buffer) and copy of 4 MiB give ``reduce`` and ``copy``.
Every figure is the median of ``--repeats`` runs. On one host the file sets the node's parameters
and the network's alike, with ``ppn`` the ranks that ran.

That is the plain model (``--plain``). By default a pair of ranks measures through its own
collectives instead (:func:`by_size`: loops timed on their slowest rank, as the simulator's time is
its last rank's): rates and latencies by size, a call's and a message's cost, the reduction and
copy by size; on two hosts also whether its messages take turns both ways (:func:`duplex`,
``half_duplex``). Across hosts (ranks started on each
host as ``python -m pycoll.sim.calibrate --out FILE`` under a launcher that spans them, MPI's or
one that sets ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``) the network's parameters are
measured between rank 0 and the first rank on another node, the node's between two ranks on rank
0's node, and ``ppn`` is the ranks of rank 0's node.

    pycoll sim calibrate --out host.toml
    pycoll sim allreduce -n 2 --machine host.toml --algorithm rd
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

BIG = 4 << 20  # bytes of the bandwidth message and of the reduction and copy
PING_SIZES = (8, 1024, 4096, 8192, 16384, 65536, 262144)  # the ping-pongs' sizes (alpha, the protocol switch)
#: The sizes of the ``*_by_size`` tables: exchanges, reductions and copies of each (4 KiB-64 MiB).
TABLE_SIZES = tuple(4096 << (2 * k) for k in range(8))
#: The size whose broadcasts give the overhead and alpha of :func:`by_size` (smaller ones may take
#: other paths).
SMALL = 1024
#: About how many bytes each table size moves in one of its runs (fewer steps as sizes grow), and
#: the fewest calls a run makes (as ``pycoll perf``'s loops, which make 10 or more: a loop of a few
#: large calls times how far the transport's buffers let a root run ahead more than its rate).
TABLE_BYTES = 64 << 20
MIN_CALLS = 8
#: The size whose exchanges and broadcasts tell a half-duplex link (:func:`duplex`; a table size,
#: large: a socket's buffers take smaller messages both ways at once), and the calls of its loops.
DUPLEX_BYTES = 16 << 20
DUPLEX_CALLS = 8
assert DUPLEX_BYTES in TABLE_SIZES
#: Both ways at once this many times as long as one way or more: the link takes turns (half
#: duplex: 2x; full: 1x; the midpoint splits the two).
HALF_DUPLEX = 1.5


def ping_pong(team: Any, pair: Tuple[int, int], nbytes: int, steps: int) -> float:
    """Seconds per message of ``steps`` round trips of ``nbytes`` between the ranks of ``pair`` (the
    first sends first) on the team's transport, each message posted and polled as a collective's
    step does (:attr:`pycoll.Team.p2p`); 0.0 on the other ranks. Collective (a barrier first)."""
    team.barrier().wait()
    if team.rank not in pair:
        return 0.0
    wire = np.zeros(max(1, nbytes), np.uint8)
    p2p, peer = team.p2p, pair[1] if team.rank == pair[0] else pair[0]
    progress = team.transport.progress  # (a request some transports finish only as they progress)
    order = ("send", "recv") if team.rank == pair[0] else ("recv", "send")
    t0 = time.perf_counter()
    for _ in range(steps):
        for kind in order:
            req = p2p.isend(wire, peer, "calibrate") if kind == "send" else p2p.irecv(wire, peer, "calibrate")
            while not req.test():
                progress()
    return (time.perf_counter() - t0) / (2 * steps)


def exchange(team: Any, pair: Tuple[int, int], nbytes: int, steps: int) -> float:
    """Seconds per step of ``steps`` exchanges of ``nbytes`` between the ranks of ``pair``, both
    sending and receiving at once as a recursive-doubling step does (both directions share the
    memory or the wire); 0.0 on the other ranks. Collective (a barrier first)."""
    team.barrier().wait()
    if team.rank not in pair:
        return 0.0
    out, into = np.zeros(max(1, nbytes), np.uint8), np.zeros(max(1, nbytes), np.uint8)
    p2p, peer = team.p2p, pair[1] if team.rank == pair[0] else pair[0]
    progress = team.transport.progress
    t0 = time.perf_counter()
    for _ in range(steps):
        reqs = [p2p.irecv(into, peer, "calibrate"), p2p.isend(out, peer, "calibrate")]
        while not all(r.test() for r in reqs):
            progress()
    return (time.perf_counter() - t0) / steps


def timed_calls(team: Any, call: Callable[[int], Any], calls: int) -> float:
    """Seconds per call of ``call(k).wait()`` for k in 0..calls-1 in a loop, as ``pycoll perf``
    times a collective (after 4 calls that build and keep its plans, and a barrier), on the
    slowest rank (a broadcast's reader, not its root, which may run ahead: the simulator's time is
    its last rank's too). Collective."""
    for k in range(4):
        call(k).wait()
    team.barrier().wait()
    t0 = time.perf_counter()
    for k in range(calls):
        call(k).wait()
    mine = np.array([(time.perf_counter() - t0) / calls])
    every = np.zeros(team.size)
    team.allgather(mine, every).wait()
    return float(every.max())


def bcasts(team: Any, buf: np.ndarray, calls: int, alternate: bool) -> float:
    """Seconds per call of ``calls`` broadcasts of ``buf`` (k-nomial: on 2 ranks one message) in a
    loop: from rank 0 every time (how many such messages a second the ranks sustain, their latency
    overlapped), or ``alternate`` roots (each call waits for the last one's message: its latency)."""
    roots = (0, 1) if alternate else (0, 0)
    return timed_calls(team, lambda k: team.bcast(buf, roots[k % 2], algorithm="knomial"), calls)


def allreduces(team: Any, src: np.ndarray, dst: np.ndarray, calls: int) -> float:
    """Seconds per call of ``calls`` recursive-doubling allreduces (on 2 ranks: one exchange, two
    messages a rank) in a loop."""
    return timed_calls(team, lambda k: team.allreduce(src, dst, algorithm="rd"), calls)


def duplex(team: Any, one_way: float, reduce_rate: float, repeats: int) -> float:
    """How many times longer a 2-rank team's messages of ``DUPLEX_BYTES`` take both ways at once
    than one way: a loop of recursive-doubling allreduces (one exchange and a reduction a call,
    less the reduction at ``reduce_rate``) against ``one_way``, the seconds a loop of broadcasts
    takes a message (:func:`by_size`'s rate at that size). About 1 where the link moves both at
    once, 2 where they take turns. Collective; medians of ``repeats`` runs."""
    src, dst = np.ones(DUPLEX_BYTES // 4, np.float32), np.empty(DUPLEX_BYTES // 4, np.float32)
    call = float(np.median([allreduces(team, src, dst, DUPLEX_CALLS) for _ in range(repeats)]))
    return max(call - DUPLEX_BYTES / reduce_rate, 0.0) / max(one_way, 1e-12)


def together(team: Any, nbytes: int, repeats: int) -> float:
    """How many times longer rank 0's reduction of ``nbytes`` (three arrays: what loads the
    caches and memory most) takes while rank 1 reduces as much at the same time than alone (at
    least 1; rank 0's figure). Collective (barriers)."""
    a, b, c = (np.ones(nbytes // 4, np.float32) for _ in range(3))
    k = max(1, min(100, TABLE_BYTES // nbytes))
    times: Dict[bool, List[float]] = {False: [], True: []}
    for _ in range(repeats):
        for both in (False, True):
            team.barrier().wait()
            if both or team.rank == 0:
                t0 = time.perf_counter()
                for _ in range(k):
                    np.add(a, b, out=c)
                times[both].append(time.perf_counter() - t0)
    return max(1.0, float(np.median(times[True]) / np.median(times[False]))) if team.rank == 0 else 1.0


def by_size(team: Any, steps: int, repeats: int) -> Dict[str, Any]:
    """The model's parameters of a 2-rank team's messages measured through its collectives
    (:func:`bcasts`; medians of ``repeats``) and its cores' work (:func:`together`): ``overhead``,
    a rank's time per message posted and
    completed (a loop of ``SMALL`` broadcasts: what a call of one message costs its rank); the rates
    by size, from loops of broadcasts (their sustained rate beyond ``overhead``); and the latency
    by size, what a message waited for costs beyond its rate (alternating roots)."""
    bufs = {n: np.ones(n, np.uint8) for n in (SMALL, *TABLE_SIZES)}  # (one per size, as perf has)

    def med(nbytes: int, alternate: bool) -> float:
        calls = max(MIN_CALLS, min(steps, TABLE_BYTES // nbytes))
        return float(np.median([bcasts(team, bufs[nbytes], calls, alternate) for _ in range(repeats)]))

    for n in bufs:  # (a first pass: the first calls of a size and of a root are slower for a while)
        med(n, True)

    loop = med(SMALL, False)  # (a call of one message: the call's start and the message's overhead)
    src, dst = np.ones(SMALL // 4, np.float32), np.empty(SMALL // 4, np.float32)
    calls = max(MIN_CALLS, min(steps, TABLE_BYTES // SMALL))
    two = float(np.median([allreduces(team, src, dst, calls) for _ in range(repeats)]))
    overhead = min(max(two - loop, 0.0), loop)  # (a call of two messages: one overhead more)
    alpha = max(med(SMALL, True) - loop, 0.0)
    rates, latency = {}, {SMALL: alpha}
    for n in TABLE_SIZES:
        sustained, waited = med(n, False), med(n, True)
        rates[n] = n / max(sustained - loop, sustained / 10)
        latency[n] = max(waited - sustained, alpha)
    shared = {n: together(team, n, repeats) for n in TABLE_SIZES}
    return {"call": loop - overhead, "overhead": overhead, "alpha": alpha, "rates": rates, "latency": latency,
            "together": shared}


def rendezvous(one_way: Dict[int, float], alpha: float, bandwidth: float) -> Tuple[int, float]:
    """(the smallest size whose messages pay a protocol's extra latency, that latency) from one-way
    times by size: a size whose time exceeds ``alpha + n / bandwidth`` by more than a third of
    ``alpha`` switched protocol (MPI's eager to rendezvous: LogGOPS's S); (0, 0) where none did."""
    extra = {n: t - alpha - n / bandwidth for n, t in sorted(one_way.items())}
    above = [n for n, e in extra.items() if e > alpha / 3]
    if not above or any(e <= alpha / 3 for n, e in extra.items() if n > above[0]):
        return 0, 0.0
    return above[0], float(np.median([extra[n] for n in above]))


def throughput_at(work: str, nbytes: int, repeats: int) -> float:
    """Bytes per second of numpy's reduction (``reduce``: out = a + b, three arrays, as an
    allreduce adds what it received to its input into its output) or copy of ``nbytes`` of
    float32 on the same arrays again and again, as a collective called in a loop works on its
    buffers (in the caches where they fit); the median of ``repeats`` runs."""
    a, b, c = (np.ones(nbytes // 4, np.float32) for _ in range(3))
    op = (lambda: np.add(a, b, out=c)) if work == "reduce" else (lambda: np.copyto(a, b))
    op()
    k = max(1, min(1000, TABLE_BYTES // nbytes))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(k):
            op()
        times.append((time.perf_counter() - t0) / k)
    return nbytes / float(np.median(times))


def throughput(work: str, repeats: int) -> float:
    """Bytes per second of numpy's reduction (``reduce``: out += in) or copy of 4 MiB of float32,
    each time on other arrays than the last (64 MiB in all: not the cache's)."""
    pairs = [(np.ones(BIG // 4, np.float32), np.ones(BIG // 4, np.float32)) for _ in range(8)]
    times = []
    for k in range(repeats):
        a, b = pairs[k % len(pairs)]
        t0 = time.perf_counter()
        if work == "reduce":
            np.add(a, b, out=a)
        else:
            np.copyto(a, b)
        times.append(time.perf_counter() - t0)
    return BIG / float(np.median(times))


def pairs(nodes: Tuple[int, ...]) -> Dict[str, Tuple[int, int]]:
    """The rank pairs to measure from each rank's node (``topology.nodes``): ``network``, rank 0
    and the first rank on another node; ``node``, rank 0 and the next rank on its node; on one
    node both are ranks 0 and 1."""
    out: Dict[str, Tuple[int, int]] = {}
    other = [r for r, node in enumerate(nodes) if node != nodes[0]]
    local = [r for r, node in enumerate(nodes) if node == nodes[0] and r]
    if other:
        out["network"] = (0, other[0])
    if local:
        out["node"] = (0, local[0])
    if not other:
        out["network"] = out["node"]
    return out


def link(team: Any, pair: Tuple[int, int], steps: int, repeats: int) -> Dict[str, float]:
    """alpha, bandwidth and the protocol switch between the ranks of ``pair``, on rank ``pair[0]``
    (medians of ``repeats`` runs; every rank takes part in the barriers)."""
    times: Dict[int, List[float]] = {n: [] for n in PING_SIZES}
    big: List[float] = []
    for _ in range(repeats):
        for n in PING_SIZES:
            times[n].append(ping_pong(team, pair, n, steps if n < 65536 else max(2, steps // 10)))
        big.append(exchange(team, pair, BIG, max(2, steps // 10)))
    one_way = {n: float(np.median(t)) for n, t in times.items()}
    alpha = one_way[8]
    bandwidth = BIG / max(float(np.median(big)) - alpha, 1e-12)
    limit, extra = rendezvous({n: t for n, t in one_way.items() if n > 8}, alpha, bandwidth)
    return {"alpha": alpha, "bandwidth": bandwidth, "rendezvous_bytes": limit, "rendezvous": extra}


def measure(team: Any, steps: int, repeats: int, plain: bool = False) -> Dict[str, Any]:
    """Run on every rank of ``team``: the parameters, on rank 0. Across hosts (the team's topology
    has several nodes) the network's come from rank 0 and a rank on another node, the node's from
    two ranks on rank 0's node (where it has two), ``ppn`` is the ranks of rank 0's node. A pair
    (2 ranks) also measures its collectives (:func:`by_size`) unless ``plain``, and a pair on two
    hosts whether its messages take turns both ways (:func:`duplex`)."""
    nodes = tuple(team.topology.nodes)
    which = pairs(nodes)
    net = link(team, which["network"], steps, repeats)
    node = net if which.get("node", which["network"]) == which["network"] else \
        link(team, which["node"], steps, repeats)
    sized = by_size(team, steps, repeats) if team.size == 2 and not plain else None  # (a pair's collectives)
    reduce_by_size = {n: throughput_at("reduce", n, repeats) for n in TABLE_SIZES}
    if sized is not None and len(set(nodes)) > 1:  # (a pair on two hosts: do its messages take turns?)
        sized["duplex"] = duplex(team, DUPLEX_BYTES / sized["rates"][DUPLEX_BYTES],
                                 reduce_by_size[DUPLEX_BYTES], repeats)
    return {**net, "node_alpha": node["alpha"], "node_bandwidth": node["bandwidth"], "by_size": sized,
            "ppn": nodes.count(nodes[0]), "nodes": len(set(nodes)),
            "reduce": throughput("reduce", repeats * 4), "copy": throughput("copy", repeats * 4),
            "reduce_by_size": reduce_by_size,
            "copy_by_size": {n: throughput_at("copy", n, repeats) for n in TABLE_SIZES}}


def half_duplex(ratio: float) -> bool:
    """Whether messages both ways at once that take ``ratio`` times as long as one way
    (:func:`duplex`) take turns: half again as long or more (full duplex: 1x; half: 2x)."""
    return ratio >= HALF_DUPLEX


def _table(values: Dict[int, float], unit: str) -> str:
    """A ``*_by_size`` table's TOML text (``unit``: ``GB/s`` for rates, ``us`` for times)."""
    scale = 1e-9 if unit == "GB/s" else 1e6
    return "{" + ", ".join(f'"{n}" = "{v * scale:.4f}{unit}"' for n, v in sorted(values.items())) + "}"


def machine_file(p: Dict[str, Any], what: str, plain: bool = False) -> str:
    """The TOML text of a machine file with the measured parameters. Where a pair's collectives
    were measured (``p["by_size"]``, :func:`by_size`) and not ``plain``: their overhead, alpha,
    rates and latencies by size, the reduction's and copy's rates by size, and a node's messages
    holding its cores (``cpu_copies``: ranks on one host copy with their own cores), or between
    hosts whether the ranks' sends and receives take turns (:func:`half_duplex`); else one
    bandwidth, alpha from Python ping-pongs and the protocol switch (``rendezvous``)."""
    sized = None if plain else p.get("by_size")
    alpha, node_alpha = (sized["alpha"], sized["alpha"]) if sized else (p["alpha"], p["node_alpha"])
    us, gbs = f"{alpha * 1e6:.3f}us", f"{p['bandwidth'] / 1e9:.4f}GB/s"
    node_us, node_gbs = f"{node_alpha * 1e6:.3f}us", f"{p['node_bandwidth'] / 1e9:.4f}GB/s"
    network = node = compute = ""
    if sized:
        tables = (f"bandwidth_by_size = {_table(sized['rates'], 'GB/s')}\n"
                  f"alpha_by_size = {_table(sized['latency'], 'us')}\n")
        network = tables
        if p.get("nodes", 1) > 1 and "duplex" in sized:
            network += (f"# {DUPLEX_BYTES >> 20} MiB both ways at once: {sized['duplex']:.4f}x one way\n"
                        + ("half_duplex = true\n" if half_duplex(sized["duplex"]) else ""))
        factors = ", ".join(f'"{n}" = {f:.3f}' for n, f in sorted(sized["together"].items()))
        if p.get("nodes", 1) == 1:  # (a pair on one host: its messages are the node's, copied by cores)
            node = tables + f"cpu_copies = true\ntogether_by_size = {{{factors}}}\n"
        compute = (f"overhead = \"{sized['overhead'] * 1e6:.3f}us\"\ncall = \"{sized['call'] * 1e6:.3f}us\"\n"
                   f"reduce_by_size = {_table(p['reduce_by_size'], 'GB/s')}\n"
                   f"copy_by_size = {_table(p['copy_by_size'], 'GB/s')}\n")
    else:
        network = (f"rendezvous_bytes = {int(p['rendezvous_bytes'])}\n"
                   f"rendezvous = \"{p['rendezvous'] * 1e6:.3f}us\"\n")
    return (f"# pycoll sim calibrate: {what}\n"
            f"[network]\nalpha = \"{us}\"\nbandwidth = \"{gbs}\"\n{network}"
            f"[node]\nppn = {int(p['ppn'])}\nalpha = \"{node_us}\"\nbandwidth = \"{node_gbs}\"\n{node}"
            f"[compute]\nreduce = \"{p['reduce'] / 1e9:.4f}GB/s\"\n"
            f"copy = \"{p['copy'] / 1e9:.4f}GB/s\"\n{compute}")


def run(args: argparse.Namespace) -> int:
    """``pycoll sim calibrate``: launch the ranks; they write the machine file."""
    from pycoll.launch import launch  # noqa: PLC0415

    n = args.ranks or 2
    if n < 2:
        print("pycoll sim calibrate: -n must be at least 2", file=sys.stderr)
        return 2
    env = {"PYCOLL_TLS": os.environ.get("PYCOLL_TLS", "mpi")}
    cmd = [sys.executable, "-m", "pycoll.sim.calibrate", "--out", args.out, "--steps", str(args.steps),
           "--repeats", str(args.repeats), *(["--plain"] if getattr(args, "plain", False) else [])]
    rc = launch(n, cmd, timeout=args.timeout, env=env)
    if rc == 0:
        with open(args.out) as f:
            print(f.read(), end="")
    return rc


def main() -> None:
    """A rank of ``pycoll sim calibrate``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--plain", action="store_true")
    args = ap.parse_args()
    team = rank_team()
    try:
        params = measure(team, args.steps, args.repeats, args.plain)
        if team.rank == 0:
            tls = os.environ.get("PYCOLL_TLS", "mpi")
            where = (f"{int(params['ppn'])} ranks on {os.uname().nodename}" if params["nodes"] == 1 else
                     f"{team.size} ranks on {params['nodes']} nodes ({int(params['ppn'])} on rank 0's)")
            what = f"{where}, PYCOLL_TLS={tls}, {args.steps} ping-pongs x {args.repeats}"
            with open(args.out, "w") as f:
                f.write(machine_file(params, what, args.plain))
    finally:
        team.close()


def rank_team() -> Any:
    """This rank's team: from a TCP store where the launch names one (``MASTER_ADDR``,
    ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, as torchrun and the ranks one starts by hand on
    several hosts have), else from MPI's world."""
    from pycoll import Team  # noqa: PLC0415

    env = os.environ
    if all(v in env for v in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")):
        from pycoll.store import TCPStore  # noqa: PLC0415

        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=rank == 0, timeout=60)
        return Team.from_store(store, rank, size)
    from mpi4py import MPI  # noqa: PLC0415

    return Team.from_mpi(MPI.COMM_WORLD)


if __name__ == "__main__":
    main()
