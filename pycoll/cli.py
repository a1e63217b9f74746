"""The ``pycoll`` command line.

    pycoll info                                  version, transports, algorithms, settings
    pycoll run -n N [--servers K] [--timeout S] -- CMD ...
                                                 launch N ranks (and K summation servers)
    pycoll perf COLL... -n N [--compare mpi]     benchmark collectives (launches the ranks itself)
    pycoll perf push_pull -n N [--servers K]     ... BytePS push-sum-pull, with K summation servers
    pycoll lower COLL --algorithm A -n N         print the program an algorithm lowers to (JSON)
    pycoll trace merge FILES... -o merged.json   combine the ranks' PYCOLL_TRACE files
    pycoll trace plot FILE... -o step.png        Gantt chart of one training step (matplotlib)
"""

# The CLI imports what a command needs when the command runs (mpi4py.MPI, UCX, perf, matplotlib):
# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

import pycoll
from pycoll import config
from pycoll.sim import cli as sim_cli


def chosen_by_size(n: int, max_bytes: int = 128 << 20, cma_slow: bool = False) -> List[str]:
    """What the selection picks for each collective on ``n`` ranks of one host, from 1 B to
    ``max_bytes`` in powers of two: one line per collective, runs of sizes with the same choice
    merged (``alltoall        1-128K shm, 256K-128M pairwise``); barrier: its one choice.
    ``cma_slow``: as a team where process_vm_readv costs more than two copies chooses."""
    from pycoll import algorithms
    from pycoll.algorithms.tuning import human_bytes as human
    from pycoll.collectives import COLLECTIVES

    lines = []
    sizes = [1 << k for k in range(max_bytes.bit_length())]
    for coll in algorithms.ALGORITHMS:
        runs: List[List] = []  # [first size, last size, algorithm]
        fallback = (COLLECTIVES[coll].default if coll in COLLECTIVES else None) or "-"  # (as the planner)
        if coll == "barrier":  # moves no data
            name = algorithms.select(coll, n, 0, shared=n > 1, cma=n > 1, default=fallback)
            lines.append(f"{coll:<15} {name}")
            continue
        for nbytes in sizes:
            name = algorithms.select(coll, n, nbytes, shared=n > 1, cma=n > 1, cma_slow=cma_slow,
                                     default=fallback)
            if runs and runs[-1][2] == name:
                runs[-1][1] = nbytes
            else:
                runs.append([nbytes, nbytes, name])
        parts = [f"{human(lo) if lo > 1 else '1'}-{human(hi)} {name}" if lo != hi else f"{human(lo)} {name}"
                 for lo, hi, name in runs]
        lines.append(f"{coll:<15} " + ", ".join(parts))
    return lines


def cmd_info(args: argparse.Namespace) -> int:
    """Print the version, the transports, the algorithms and the settings with their values."""
    from pycoll import algorithms

    print(f"pycoll {pycoll.__version__} (python {sys.version.split()[0]})")
    print("\ntransports:")
    print("  local    in-process ranks (pycoll.local_teams)")
    print("  self     team of one")
    print("  tcp      sockets between ranks of a team made with Team.from_store")
    try:
        import mpi4py
        from mpi4py import MPI

        lib = MPI.Get_library_version().splitlines()[0].strip()
        print(f"  mpi      mpi4py {mpi4py.__version__}, {lib}")
    except Exception as exc:  # pragma: no cover - depends on the install
        print(f"  mpi      unavailable: {exc}")
    try:
        from pycoll.tl.ucx import info as ucx_info

        ucx = ucx_info()
        print(f"  ucx      UCX {ucx['version']} ({ucx['source']}: {ucx['library']}), PYCOLL_TLS=ucx,...")
        print(f"           transports/devices: {', '.join(ucx['transports'])}")
    except Exception as exc:  # pragma: no cover - depends on the install
        print(f"  ucx      unavailable: {exc}")
    print("\nframeworks:")
    try:
        from importlib.metadata import PackageNotFoundError, version

        torch_version = version("torch")
        print(f"  torch    torch.distributed backend 'pycoll' (torch {torch_version}): import pycoll.torch")
    except PackageNotFoundError:
        print("  torch    not installed: the 'pycoll' torch.distributed backend needs it (pip install "
              "torch==2.13.0 for the CPU build; an unpinned torch pulls several GB of CUDA packages)")
    print("\nalgorithms:")
    for coll, table in algorithms.ALGORITHMS.items():
        extra = ", push_pull (BytePS summation services; by name only)" if coll == "allreduce" else ""
        print(f"  {coll:<10} {', '.join(table)}{extra}")
        if coll == "allreduce":
            print(f"  {'':<10} (mapped: for arrays of team.alloc, whatever the table says)")
    print("\nprograms (pycoll lower; team.run_program runs one: natively over UCX, else in Python):")
    print(f"  lowered: {', '.join(lowerable())}")
    print("\nselection (first match wins; PYCOLL_TUNE rules come first):")
    for rule in algorithms.rules():
        print(f"  {rule}")
    if args.n is not None:
        slow = False
        try:
            from pycoll.tl.shm.transport import CMA_SLOW_RATIO, cma_cost

            cost = cma_cost(os.getpid())
            slow = cost > CMA_SLOW_RATIO
            cma = f"a process_vm_readv here costs {cost:.1f} copies: {'slow' if slow else 'fast'}"
        except ImportError:  # (no native build)
            cma = "taken as fast"
        print(f"\nchosen for {args.n} ranks on one host (untagged calls, shared segment and CMA usable, "
              f"{cma}; bytes as the call counts them: the whole buffer of the block collectives):")
        for line in chosen_by_size(args.n, cma_slow=slow):
            print(f"  {line}")
    print("\nsettings (environment variables):")
    for name, value, doc in config.describe():
        print(f"  {name:<24} {value}")
        print(f"  {'':<24} {doc}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Launch ranks with the bundled mpiexec."""
    from pycoll.launch import launch

    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        print("pycoll run: give a command after --", file=sys.stderr)
        return 2
    # (the process exits next: a signal after the job's end must not turn its status into a death)
    return launch(args.n, cmd, timeout=args.timeout, servers=args.servers, bind=args.bind,
                  keep_handlers=True)


def cmd_perf(args: argparse.Namespace, argv: List[str]) -> int:
    """Run the benchmark, launching ranks first unless already under MPI."""
    from pycoll import perf, scaling
    from pycoll.launch import launch, under_mpi

    try:  # bad arguments fail here, before any rank starts
        counts = scaling.rank_counts(str(args.n))
        if len(counts) > 1:
            if under_mpi():
                raise ValueError("-n with several rank counts launches its own ranks: run it without mpiexec")
            if args.servers:
                raise ValueError("-n with several rank counts does not start push_pull servers")
            perf.validate(args)  # (against the smallest count, which the others can only pass)
            return _perf_sweep(args, argv, counts)
        args.n = counts[0]
        perf.validate(args)
        mpi = under_mpi()
        if mpi and args.servers is not None and args.servers != config.get("PYCOLL_NUM_SERVERS"):
            raise ValueError(f"--servers {args.servers}: under an MPI launch the servers are the last "
                             f"PYCOLL_NUM_SERVERS={config.get('PYCOLL_NUM_SERVERS')} ranks")
    except ValueError as exc:
        print(f"pycoll perf: {exc}", file=sys.stderr)
        return 2
    if (args.n > 1 or args.servers) and not mpi:
        # the servers run python -m pycoll.ps.server; none unless --servers (not even inherited)
        return launch(args.n, [sys.executable, "-m", "pycoll.cli", *argv], timeout=args.timeout,
                      env={"PYCOLL_NUM_SERVERS": "0"}, servers=args.servers or 0, bind=args.bind)
    return perf.run(args)  # a server rank serves inside and leaves with SystemExit(0), printing nothing


def _perf_sweep(args: argparse.Namespace, argv: List[str], counts: List[int]) -> int:
    """``pycoll perf ... -n 2,4,8``: one launch per rank count, then the vs_mpi table (and picture)."""
    from pycoll import scaling
    from pycoll.launch import launch

    def launch_one(n: int, child_argv: List[str]) -> int:
        cmd = [sys.executable, "-m", "pycoll.cli", *child_argv]
        return launch(n, cmd, timeout=args.timeout, env={"PYCOLL_NUM_SERVERS": "0"}, servers=0,
                      bind=args.bind)

    status, rows = scaling.sweep(argv, counts, launch_one)
    print(scaling.table(rows, counts), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {"ranks": counts}, "rows": rows}, f, indent=1)
    if args.plot:
        print(f"# plot: {scaling.plot(rows, counts, args.plot)}", flush=True)
    return status


def cmd_lower(args: argparse.Namespace) -> int:
    """Lower an algorithm and print one rank's program (or every rank's) as JSON."""
    from pycoll.config import parse_bytes
    from pycoll.dtypes import as_dtype
    from pycoll.lower import lower

    dtype = as_dtype(args.dtype)
    count = parse_bytes(args.bytes) // dtype.itemsize if args.coll != "barrier" else 0
    programs = lower(args.coll, args.algorithm, args.n, count, dtype, args.op, args.root,
                     in_place=args.in_place)
    if args.rank is None:
        print("[\n" + ",\n".join(p.dumps() for p in programs) + "\n]")
    elif not 0 <= args.rank < args.n:
        raise pycoll.PycollError(f"--rank {args.rank} is not a rank of {args.n}")
    else:
        print(programs[args.rank].dumps())
    return 0


def lowerable(n: int = 4) -> List[str]:
    """``coll:algorithm`` of every algorithm that lowers to programs (tried on ``n`` in-process
    ranks, 8 elements, and checked against the algorithm)."""
    from pycoll import algorithms
    from pycoll.lower import NotLowerable, lower
    from pycoll.lower.record import LOWERED

    found = []
    for coll in LOWERED:
        for name in algorithms.ALGORITHMS[coll]:
            try:
                lower(coll, name, n, 0 if coll == "barrier" else 8)
            except NotLowerable:  # (schedules of tasks, the segment's forms, ...)
                continue
            found.append(f"{coll}:{name}")
    return found


def cmd_trace_merge(args: argparse.Namespace) -> int:
    """Combine per-rank trace files into one (pid = rank)."""
    from pycoll.trace.files import merge

    paths = merge(args.files, args.output)
    print(f"merged {len(paths)} trace file{'s' if len(paths) != 1 else ''} into {args.output}")
    return 0


def cmd_trace_plot(args: argparse.Namespace) -> int:
    """Draw one step of a trace as a PNG Gantt chart."""
    from pycoll.trace.plot import plot

    drawn = plot(args.files, args.output, step=args.step, subtasks=args.subtasks, whole=args.all)
    what = f"step {drawn['step']}" if drawn["step"] is not None else "whole trace"
    print(f"{args.output}: {what}, {drawn['ms']:.3f} ms, {drawn['ranks']} rank(s), {drawn['rows']} rows")
    return 0


def pycoll_version() -> str:
    """The installed pycoll's version."""
    import pycoll

    return pycoll.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pycoll", description="pycoll: collective task/schedule engine")
    parser.add_argument("--version", action="version", version=f"pycoll {pycoll_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="version, transports, algorithms and settings")
    info.add_argument("-n", type=int, default=None, metavar="N",
                      help="also show what the selection chooses for N ranks on one host, size by size")
    info.set_defaults(func=cmd_info)

    run = sub.add_parser("run", help="launch N ranks with the bundled mpiexec")
    run.add_argument("-n", type=int, required=True, help="number of ranks")
    run.add_argument("--timeout", type=float, default=None,
                     help="end all ranks after this many seconds (default: no limit)")
    run.add_argument("--servers", type=int, default=0,
                     help="also start K push-pull summation servers (python -m pycoll.ps.server; default 0)")
    run.add_argument("--bind", choices=["none", "core", "auto"], default="none",
                     help="core: pin each rank to a core of its own (mpiexec -bind-to core; for as many "
                          "ranks as cores or fewer); auto: core where the ranks do not outnumber the "
                          "cores, else none; none (default): the kernel places them")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and arguments")
    run.set_defaults(func=cmd_run)

    from pycoll.perf import COLLS, describe

    perf = sub.add_parser(
        "perf", help="benchmark collectives against MPI's own",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time pycoll's collectives (and, with --compare mpi, MPI's in the same run) at doubling "
                    "sizes; algbw = size / time, busbw = algbw * nccl-tests' factor.",
        epilog="collectives (size: what the bytes column counts, as in nccl-tests; the v-variants run "
               "with equal counts):\n" + describe())
    perf.add_argument("coll", nargs="+", choices=(*COLLS, "all"), metavar="COLL",
                      help=f"one or more of: {', '.join(COLLS)}; or all (all but push_pull)")
    perf.add_argument("-n", default="2",
                      help="ranks to launch (default 2; push_pull: workers); several separated by commas "
                           "(2,4,8,16): one run each, then a table of vs_mpi by rank count (--plot draws it)")
    perf.add_argument("--servers", type=int, default=None, metavar="K",
                      help="push_pull: also start K summation servers (default 0; under a launch of "
                           "one's own, PYCOLL_NUM_SERVERS=K)")
    perf.add_argument("--min-bytes", default="8", metavar="SIZE",
                      help="smallest size (default 8; suffixes K, M, G: 64K, 4M, 1G; sizes double from here)")
    perf.add_argument("--max-bytes", default="128M", metavar="SIZE",
                      help="largest size (default 128M; suffixes as --min-bytes)")
    perf.add_argument("--sizes", default=None, metavar="LIST",
                      help="these sizes only, separated by commas (8,4K,64K,1M,4M), instead of doubling "
                           "from --min-bytes to --max-bytes")
    perf.add_argument("--dtype", default="float32",
                      help="element type (default float32; any numpy name pycoll reduces: int8-64, uint8-64, "
                           "float16, bfloat16, float32, float64, complex64, complex128, bool)")
    perf.add_argument("--op", default=None,
                      help="reduction of allreduce, reduce, reduce_scatter(v) (default sum)")
    perf.add_argument("--root", type=int, default=None,
                      help="root of bcast, reduce, gather(v), scatter(v) (default 0)")
    perf.add_argument("--algorithm", default="auto",
                      help="auto (default: the selection table's), one of the collective's algorithms, "
                           "or all (each that can run here, one table each)")
    perf.add_argument("--iters", type=int, default=0, help="calls per size (default: by size)")
    perf.add_argument("--warmup", type=int, default=None,
                      help="warm-up calls per size (default: a tenth of the calls, 2 to 10)")
    perf.add_argument("--check", action="store_true", help="verify every size against numpy (pycoll and MPI)")
    perf.add_argument("--compare", choices=["mpi", "none"], default="none",
                      help="mpi: also time MPI's own collective in the same run (default none)")
    perf.add_argument("--alloc", action="store_true",
                      help="buffers made by team.alloc (memory every rank on the host maps), for "
                           "pycoll and MPI alike")
    perf.add_argument("--bind", choices=["none", "core", "auto"], default="auto",
                      help="auto (default): pin each rank it launches to a core of its own (mpiexec "
                           "-bind-to core) where the ranks do not outnumber the cores, else leave them "
                           "to the kernel; core: always pin; none: never")
    perf.add_argument("--json", default=None, help="write the results to this file (default: none)")
    perf.add_argument("--plot", default=None, metavar="FILE.png",
                      help="draw time and busbw against size, pycoll next to MPI (one picture per "
                           "collective: FILE_<coll>.png when there are several; needs matplotlib)")
    perf.add_argument("--timeout", type=float, default=1800,
                      help="kill the ranks after this many seconds (default 1800)")
    perf.set_defaults(func=None)

    low = sub.add_parser("lower", help="print the program an algorithm lowers to",
                         description="Record what an algorithm does on every rank of an in-process team, "
                                     "check it against the algorithm (same bits) and print the program "
                                     "as JSON (team.run_program runs one).")
    low.add_argument("coll", help="allreduce, reduce, bcast, allgather or barrier")
    low.add_argument("--algorithm", required=True, help="one of the collective's point-to-point algorithms")
    low.add_argument("-n", type=int, default=4, help="team size (default 4)")
    low.add_argument("--rank", type=int, default=None, help="print this rank's program (default: all ranks')")
    low.add_argument("--bytes", default="4K", help="buffer size (default 4K; suffixes K, M, G)")
    low.add_argument("--dtype", default="float32", help="element type (default float32)")
    low.add_argument("--op", default="sum", help="reduction (default sum)")
    low.add_argument("--root", type=int, default=0, help="root of bcast and reduce (default 0)")
    low.add_argument("--in-place", action="store_true", help="in place (allreduce, reduce)")
    low.set_defaults(func=cmd_lower)

    trace = sub.add_parser("trace", help="merge and plot PYCOLL_TRACE timelines",
                           description="Work with the Chrome/Perfetto traces PYCOLL_TRACE=file.json writes "
                                       "(one file per rank: file.rank0.json, ...).")
    tsub = trace.add_subparsers(dest="trace_command", required=True)
    merge = tsub.add_parser("merge", help="combine the ranks' trace files into one (pid = rank)")
    merge.add_argument("files", nargs="+",
                       help="trace files, globs, or the PYCOLL_TRACE value (trace.json: trace.rank*.json)")
    merge.add_argument("-o", "--output", default="merged.json", help="merged trace (default merged.json)")
    merge.set_defaults(func=cmd_trace_merge)
    tplot = tsub.add_parser("plot", help="PNG Gantt chart of one training step (needs matplotlib)")
    tplot.add_argument("files", nargs="+",
                       help="a merged trace, or per-rank files / globs / the PYCOLL_TRACE value")
    tplot.add_argument("-o", "--output", default="step.png", help="PNG file (default step.png)")
    which = tplot.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None,
                       help="the step to draw (default: a middle one of the marked steps; the whole "
                            "trace if none is marked)")
    which.add_argument("--all", action="store_true", help="draw the whole trace, steps marked or not")
    tplot.add_argument("--subtasks", action="store_true",
                       help="also draw the tasks inside collectives (sends, receives, reductions)")
    tplot.set_defaults(func=cmd_trace_plot)
    sim_cli.add_parser(sub)  # pycoll sim (pycoll.sim.cli)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    level = os.environ.get("PYCOLL_LOG_LEVEL")
    if level:
        import logging

        logging.basicConfig(level=config.get("PYCOLL_LOG_LEVEL"))
    try:
        if args.command == "perf":
            return cmd_perf(args, argv)
        if args.command == "sim":
            return sim_cli.run(args)
        return args.func(args)
    except pycoll.PycollError as exc:
        print(f"pycoll: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
