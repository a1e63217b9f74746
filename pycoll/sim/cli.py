"""``pycoll sim``: simulate a collective's algorithms on many ranks and print ``pycoll perf``'s
table (time, algbw, busbw) with the alpha-beta-gamma closed form beside it.

    pycoll sim allreduce -n 1024 --algorithm rd,rabenseifner --min-bytes 8 --max-bytes 64M
    pycoll sim bcast -n 4096 --machine m.toml --json out.json --stats
    pycoll sim allreduce -n 512 --ppn 8 --nodes-per-leaf 16 --oversubscription 4 --min-bytes 64M
    pycoll sim calibrate --out host.toml      # this host's parameters, measured
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

from pycoll.config import parse_bytes
from pycoll.lower.record import NotLowerable
from pycoll.sim import calibrate, engine, formulas, machine, timeline, training
from pycoll.sim.payload import Payload
from pycoll.sim.programs import looped, moved
from pycoll.sim.programs import programs as rank_programs

#: The algorithms ``--algorithm all`` simulates per collective.
ALL = {"allreduce": ("rd", "knomial", "rabenseifner", "ring"), "bcast": ("knomial", "scatter_allgather"),
       "allgather": ("ring", "rd", "bruck"), "reduce_scatter": ("ring", "rhalving"), "reduce": ("knomial",),
       "alltoall": ("pairwise",), "gather": ("knomial", "linear"), "scatter": ("knomial", "linear"),
       "barrier": ("dissemination",)}


def add_parser(sub: Any) -> None:
    """The ``sim`` subcommand's arguments."""
    p = sub.add_parser("sim", help="simulate a collective's algorithms on many ranks against a network model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("coll", choices=sorted(ALL) + ["calibrate", "train"],
                   help="the collective to simulate; calibrate: measure this host into a machine file; "
                        "train: a VGG16 training step, gradients FIFO or by priority (pycoll.sim.training)")
    p.add_argument("-n", "--ranks", type=int, help="ranks to simulate (calibrate: ranks to run, 2)")
    p.add_argument("--algorithm", default="all", help="comma-separated, or all (default)")
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--machine", help="a TOML machine file (see pycoll.sim.machine); flags below override it")
    p.add_argument("--alpha", help="network latency (e.g. 2us)")
    p.add_argument("--bandwidth", help="network bandwidth per link (e.g. 12.5GB/s)")
    p.add_argument("--ppn", type=int, help="ranks per node (the node's alpha and bandwidth within one)")
    p.add_argument("--reduce", help="reduction throughput per rank (e.g. 5GB/s)")
    p.add_argument("--overhead", help="a rank's time posting a send or a receive (LogGP's o; e.g. 0.5us)")
    p.add_argument("--overhead-per-byte",
                   help="a rank's time posting a message, per byte of it (LogGOPS's O; e.g. 0.1ns)")
    p.add_argument("--gap", help="the least time between two messages' starts on a rank's link out, or "
                                 "arrivals on its link in (LogGP's g; e.g. 1us; not with --contention, "
                                 "whose flows share the links, nor for a node's messages its cores copy)")
    p.add_argument("--contention", action="store_true",
                   help="links shared by the messages crossing them, max-min fair (NICs; with "
                        "--nodes-per-leaf a fat tree's uplinks too)")
    p.add_argument("--nics", type=int, help="NICs (rails) per node, --bandwidth each (with --contention)")
    p.add_argument("--nodes-per-leaf", type=int,
                   help="a two-level fat tree: nodes per leaf switch (implies --contention)")
    p.add_argument("--oversubscription", type=float,
                   help="the fat tree's leaf downlinks : uplinks (e.g. 4; implies --contention)")
    p.add_argument("--late", action="append", default=[], metavar="RANK:SECONDS",
                   help="a rank that starts late (repeatable)")
    p.add_argument("--slow", action="append", default=[], metavar="RANK:FACTOR",
                   help="a rank whose every cost is FACTOR times (repeatable)")
    p.add_argument("--kill", action="append", default=[], metavar="RANK:SECONDS",
                   help="a rank whose process dies at that simulated time; its peers know after the "
                        "machine's detect (50 ms) (repeatable)")
    p.add_argument("--kill-node", action="append", default=[], metavar="NODE:SECONDS",
                   help="a node (its --ppn ranks) that goes silent at that time; its peers know after the "
                        "machine's silence (1.5 s, PYCOLL_PEER_SILENCE) (repeatable)")
    p.add_argument("--payload", action="store_true",
                   help="move and reduce real data as the instructions run and check every rank's result "
                        "against numpy (memory: ranks x size; up to a few hundred ranks)")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--plot", metavar="PNG",
                   help="draw time and busbw against size per algorithm (matplotlib)")
    p.add_argument("--trace", metavar="JSON",
                   help="write each row's simulated timeline (Perfetto/Chrome trace; several rows: "
                        "JSON_<algorithm>_<bytes>.json)")
    p.add_argument("--stats", action="store_true", help="events processed and their rate, per row")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes that record the ranks' programs side by side, from 256 ranks (default: "
                        "the cores this process may use, at most 8; 1: this process alone)")
    p.add_argument("--out", default="machine.toml", help="calibrate: the machine file to write")
    p.add_argument("--steps", type=int, default=1000, help="calibrate: ping-pongs per measurement")
    p.add_argument("--repeats", type=int, default=5, help="calibrate: measurements (the median is kept)")
    p.add_argument("--calls", type=int, default=1,
                   help="simulate a loop of this many calls, each rank's next call once its last one "
                        "finished (as pycoll perf times them), and print the time per call")
    p.add_argument("--plain", action="store_true",
                   help="calibrate: one bandwidth, alpha from Python ping-pongs (no rates by size, no cores)")
    p.add_argument("--timeout", type=float, default=300, help="calibrate: seconds the ranks may take")
    p.add_argument("--forward", type=float, default=0.25,
                   help="train: seconds of forward compute per step (backward: twice as long)")
    p.add_argument("--partition", default="4M",
                   help="train: the parts priority scheduling cuts gradients into")
    p.add_argument("--servers", type=int, default=0,
                   help="train: reduce the gradients by BytePS's push-sum-pull through this many summation "
                        "servers (ranks after the -n workers) instead of allreduce")
    p.add_argument("--credit", default="",
                   help="train: bytes of parts in flight at once under priority (ByteScheduler's credit; "
                        "default: one part at a time)")
    p.add_argument("--tune", action="store_true",
                   help="print the PYCOLL_TUNE rules that pick the fastest simulated algorithm per size, and "
                        "where they differ from the default selection")


def _pairs(items: List[str], what: str, convert: Any) -> Dict[int, float]:
    """``--late``/``--slow``/``--kill``'s ``RANK:VALUE`` items as {rank: value}; ValueError names
    a malformed one."""
    out = {}
    for item in items:
        rank, _, value = item.partition(":")
        try:
            if not value:
                raise ValueError("no value")
            out[int(rank)] = convert(value)
        except ValueError as exc:
            raise ValueError(f"--{what} takes RANK:VALUE, not {item!r} ({exc})") from None
    return out


def train(args: argparse.Namespace, m: machine.Machine) -> int:
    """``pycoll sim train``: VGG16's step on ``-n`` workers, FIFO against priority, and the ideal."""
    alg = "rabenseifner" if args.algorithm == "all" else args.algorithm
    part = parse_bytes(args.partition)
    layers = training.vgg16(args.forward)
    servers = args.servers
    comm = (training.push_pull_time(m, args.ranks, servers) if servers else
            training.reduce_time(m, args.ranks, alg))
    credit = parse_bytes(args.credit) if args.credit else 0
    fifo = training.step_time(layers, comm, "fifo")
    prio = training.step_time(layers, comm, "priority", part, credit=credit)
    best = training.ideal(layers, comm, part, credit)
    compute = sum(layer.forward + layer.backward for layer in layers)
    print(f"# pycoll sim train: VGG16 (138.4 M float32 parameters) on {args.ranks} workers; {m.describe()}")
    flight = f"priority with a credit of {args.credit}" if credit else "one message at a time"
    how = f"push-sum-pull through {servers} servers" if servers else f"allreduce {alg}"
    print(f"# gradients reduced by {how}, {flight}; compute {compute * 1e3:.0f} ms a "
          f"step (forward {args.forward * 1e3:g} ms, backward twice that)")
    print(f"{'policy':>22} {'step_ms':>10} {'vs_ideal':>9}")
    for name, t in (("fifo", fifo), (f"priority ({args.partition} parts)", prio), ("ideal", best)):
        print(f"{name:>22} {t * 1e3:>10.1f} {t / best:>9.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"workers": args.ranks, "machine": m.describe(), "algorithm": alg, "fifo_s": fifo,
                       "priority_s": prio, "ideal_s": best, "partition": part, "credit": credit,
                       "servers": servers}, fh,
                      indent=1)
    return 0


def _failure_line(res: engine.Result) -> str:
    """What a simulated death did: who died when, who raised PeerLostError when, who finished."""
    died = ", ".join(f"{r} at {t * 1e6:.1f}" for r, t in sorted(res.died.items())[:4])
    more = f" (and {len(res.died) - 4} more)" if len(res.died) > 4 else ""
    text = f"died (us): rank {died}{more}; "
    if res.errors:
        errs = sorted(res.errors.values())
        text += (f"PeerLostError on {len(errs)} survivors at {errs[0] * 1e6:.1f}-{errs[-1] * 1e6:.1f} us; ")
    done = len(res.finish) - len(res.died) - len(res.errors)
    return text + f"{done} finished"


def tune(coll: str, ranks: int, rows: List[Dict[str, Any]]) -> str:
    """The ``PYCOLL_TUNE`` rules (for teams of ``ranks``) that choose, at each simulated size, the
    fastest algorithm pycoll can run by that name, each range from its size to the next; and a line
    per size where the default selection (across nodes, no shared segment) picks another, with how
    much slower the simulation finds it."""
    from pycoll import algorithms  # noqa: PLC0415 - the tables, only for --tune
    from pycoll.algorithms import tuning  # noqa: PLC0415

    known = algorithms.ALGORITHMS[coll]
    by_size: Dict[int, Dict[str, float]] = {}
    for r in rows:  # (sizes a block form rounded up to whole blocks are not compared)
        if r["algorithm"] in known and r["bytes"] == r["nominal"]:
            by_size.setdefault(r["nominal"], {})[r["algorithm"]] = r["time_us"]
    sizes = sorted(by_size)
    if not sizes:
        return f"# --tune: no simulated algorithm of {coll} is one pycoll runs by that name"
    best = [min(by_size[s], key=by_size[s].get) for s in sizes]
    rules, notes = [], []
    lo = 0
    for k, s in enumerate(sizes):
        if k + 1 == len(sizes) or best[k + 1] != best[k]:
            hi = "inf" if k + 1 == len(sizes) else tuning.human_bytes(sizes[k + 1])
            rules.append(f"{coll}:{tuning.human_bytes(lo)}-{hi}:team={ranks}-{ranks}:{best[k]}")
            lo = sizes[k + 1] if k + 1 < len(sizes) else lo
        default = algorithms.select(coll, ranks, s, default="?")
        if default != best[k] and default in by_size[s]:
            slower = by_size[s][default] / by_size[s][best[k]]
            notes.append(f"#   {s} B: the default table picks {default}, {slower:.2f}x the time of {best[k]}")
    text = "PYCOLL_TUNE=" + ";".join(rules)
    tuning.parse(text.split("=", 1)[1], algorithms.ALGORITHMS)  # (what it prints, pycoll reads)
    return "\n".join([f"# the fastest simulated {coll} algorithm per size on {ranks} ranks:", text] + notes)


def run(args: argparse.Namespace) -> int:
    """Simulate and print the table; 0, or 2 for arguments it cannot take."""
    from pycoll.perf import BUS_FACTOR  # noqa: PLC0415 - (the perf module is large; only here)

    if args.coll == "calibrate":
        return calibrate.run(args)
    if args.ranks is None:
        print("pycoll sim: -n is required", file=sys.stderr)
        return 2
    try:
        m = machine.load(args.machine) if args.machine else machine.Machine()
        if args.alpha:  # (a value given here replaces the machine file's table of it)
            m.alpha, m.alpha_by_size = machine.seconds(args.alpha), ()
        if args.bandwidth:
            m.bandwidth, m.bandwidth_by_size = machine.rate(args.bandwidth), ()
        if args.reduce:
            m.reduce_bw, m.reduce_by_size = machine.rate(args.reduce), ()
        if args.overhead:
            m.overhead = machine.seconds(args.overhead)
        if args.overhead_per_byte:
            m.overhead_per_byte = machine.seconds(args.overhead_per_byte)
        if args.gap:
            m.gap = machine.seconds(args.gap)
        if min(m.alpha, m.overhead, m.overhead_per_byte, m.gap) < 0 or not m.bandwidth > 0 < m.reduce_bw:
            raise ValueError("--alpha, --overhead, --overhead-per-byte and --gap must be at least 0, "
                             "--bandwidth and --reduce positive")
    except (OSError, ValueError) as exc:
        print(f"pycoll sim: {exc}", file=sys.stderr)
        return 2
    if args.ppn:
        m.ppn = args.ppn
    if args.nics:
        m.nics = args.nics
    if args.nodes_per_leaf is not None:
        m.nodes_per_leaf = args.nodes_per_leaf
    if args.oversubscription:
        m.oversubscription = args.oversubscription
    m.contention = m.contention or args.contention or args.nodes_per_leaf is not None or bool(
        args.oversubscription)
    if args.coll == "train":
        return train(args, m)
    n = args.ranks
    try:
        late = _pairs(args.late, "late", machine.seconds)
        slow = _pairs(args.slow, "slow", float)
        fail = {r: (t, m.detect) for r, t in _pairs(args.kill, "kill", machine.seconds).items()}
        for node, t in _pairs(args.kill_node, "kill-node", machine.seconds).items():
            fail.update({r: (t, m.silence) for r in range(node * m.ppn, min(n, (node + 1) * m.ppn))})
    except ValueError as exc:
        print(f"pycoll sim: {exc}", file=sys.stderr)
        return 2
    if n < 1 or any(not 0 <= r < n for r in list(late) + list(slow) + list(fail)):
        print("pycoll sim: -n must be at least 1, and --late/--slow/--kill ranks (--kill-node nodes) "
              "within it", file=sys.stderr)
        return 2
    if args.calls < 1 or args.calls > 1 and (args.payload or fail or late):
        print("pycoll sim: --calls must be at least 1 (and 1 with --payload, --kill or --late)",
              file=sys.stderr)
        return 2
    if m.contention and m.by_size:
        print("pycoll sim: a machine's *_by_size tables, cpu_copies, together_by_size, call and "
              "half_duplex model measured hosts' costs; they do not combine with shared links "
              "(--contention, [fabric])",
              file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print("pycoll sim: --jobs must be at least 1", file=sys.stderr)
        return 2
    if m.nics < 1 or m.nodes_per_leaf < 0 or m.oversubscription <= 0:
        print("pycoll sim: --nics must be at least 1, --nodes-per-leaf at least 0 and --oversubscription "
              "positive", file=sys.stderr)
        return 2
    algs = ALL[args.coll] if args.algorithm == "all" else tuple(args.algorithm.split(","))
    sizes = []
    size, top = max(1, parse_bytes(args.min_bytes)), parse_bytes(args.max_bytes)
    while size <= top:
        sizes.append(size)
        size *= 4 if args.coll != "barrier" else top + 1
    factor = BUS_FACTOR.get(args.coll)
    print(f"# pycoll sim {args.coll} on {n} ranks; {m.describe()}")
    print(f"# algbw = size / time; busbw = algbw * {args.coll}'s factor; formula: the alpha-beta-gamma "
          "closed form (network level)")
    head = f"{'algorithm':>14} {'bytes':>12} {'time_us':>12} {'algbw':>8} {'busbw':>8} {'formula_us':>12}"
    print(head + (f" {'events':>9} {'Mev/s':>6} {'wall_s':>7}" if args.stats else ""))
    rows = []
    traces: List[tuple] = []  # (algorithm, bytes, spans) of each row, with --trace
    itemsize = np.dtype(args.dtype).itemsize
    for alg in algs:
        done = set()
        for nominal in sizes:
            nbytes = moved(args.coll, alg, nominal, n, itemsize)
            if nbytes in done:  # (sizes that round to the same blocks: shown once)
                continue
            done.add(nbytes)
            t0 = time.perf_counter()
            data = None
            try:
                if args.payload:
                    data = Payload(args.coll, alg, n, nominal, args.dtype)
                    progs = data.compacts
                else:
                    progs = rank_programs(args.coll, alg, n, nbytes, args.dtype, jobs=args.jobs)
            except (NotLowerable, ValueError) as exc:
                print(f"{alg:>14} cannot be simulated: {exc}")
                break
            if args.calls > 1 or m.call and data is None:
                progs = looped(progs, args.calls, call=m.call > 0)
            spans: Optional[list] = [] if args.trace else None
            res = engine.run(progs, m, late, slow, fail, spans, data)
            if args.calls > 1:
                res.time /= args.calls
            if spans is not None:
                traces.append((alg, nbytes, spans))
            if res.unmatched:
                print(f"{alg:>14} {nbytes:>12} did not finish: {res.unmatched[0]}")
                continue
            f = formulas.predicted(args.coll, alg, n, nbytes, m)
            algbw = nbytes / res.time / 1e9 if res.time > 0 and factor is not None else math.nan
            busbw = algbw * factor(n) if factor is not None else math.nan
            row = {"algorithm": alg, "bytes": nbytes, "nominal": nominal, "time_us": res.time * 1e6,
                   "algbw": algbw, "busbw": busbw, "formula_us": f * 1e6, "events": res.events,
                   "events_per_s": res.events_per_s, "wall_s": time.perf_counter() - t0}
            rows.append(row)
            line = (f"{alg:>14} {nbytes:>12} {row['time_us']:>12.2f} {algbw:>8.2f} {busbw:>8.2f} "
                    f"{row['formula_us']:>12.2f}")
            if args.stats:
                line += f" {res.events:>9} {res.events_per_s / 1e6:>6.2f} {row['wall_s']:>7.2f}"
            if data is not None:
                wrong = data.wrong()
                row["wrong"] = wrong
                line += f"  payload: {'right on every rank' if not wrong else 'WRONG on ' + ', '.join(wrong)}"
            print(line, flush=True)
            if res.died:
                row.update(died={str(r): t * 1e6 for r, t in res.died.items()},
                           errors={str(r): t * 1e6 for r, t in res.errors.items()})
                print(f"{'':>14} {_failure_line(res)}")
    if args.tune:
        print(tune(args.coll, n, rows))
    for alg, nbytes, spans in traces:
        stem, ext = os.path.splitext(args.trace)
        path = args.trace if len(traces) == 1 else f"{stem}_{alg}_{nbytes}{ext or '.json'}"
        timeline.write(spans, f"{args.coll} {alg} {nbytes} B on {n} ranks; {m.describe()}", path)
        print(f"# timeline: {path}")
    if args.plot and rows:
        from pycoll import perfplot  # noqa: PLC0415 - (matplotlib, only for --plot)

        meta = {"coll": args.coll, "ranks": n, "dtype": args.dtype, "transport": "simulated",
                "algorithm": algs[0] if len(algs) == 1 else "all", "machine": m.describe(),
                "factor": f"{factor(n):g}" if factor else "", "bus_factor": factor(n) if factor else None}
        perfplot.plot([dict(r, coll=args.coll, avg_us=r["time_us"]) for r in rows], [meta], args.plot,
                      title="pycoll sim")
        print(f"# plot: {args.plot}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"coll": args.coll, "ranks": n, "machine": m.describe(), "rows": rows}, fh, indent=1)
    return 0
