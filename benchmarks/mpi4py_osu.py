"""mpi4py's own OSU demos, with plain MPI and with ``pycoll.mpi.Comm`` swapped in, side by side.

Fetches the source distribution of the installed mpi4py at run time (as
``benchmarks/mpi4py_suite.py`` does; never vendored) and runs its collective latency demos
(``demo/osu_bcast.py``, ``osu_allgather.py``, ``osu_alltoall.py``, ``osu_alltoallv.py``,
``osu_gather.py``, ``osu_scatter.py``) unchanged: each rank imports the demo and calls it twice in
one job, alternating which goes first, once as written and once with ``MPI.COMM_WORLD`` a
``pycoll.mpi.Comm`` of it (the demo's ``from mpi4py import MPI`` then finds a module whose
``COMM_WORLD`` is the Comm; everything else is mpi4py's). The demos pass their buffers as users
of mpi4py do, ``[mmap, size, MPI.BYTE]`` (and ``MPI.IN_PLACE`` at the root of Gather and Scatter,
in Allgather). It prints, per demo and rank count, each size's latency under MPI and under
pycoll (the better of ``--reps`` runs each) and their ratio (pycoll's time / MPI's: below 1 is
pycoll faster)::

    python benchmarks/mpi4py_osu.py [-n 2,4] [--demos bcast,allgather,...] [--reps 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import types
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpi4py_suite as suite  # noqa: E402 - its sibling: the download and the job

DEMOS = ("bcast", "allgather", "alltoall", "alltoallv", "gather", "scatter")


# ------------------------------------------------------------------ one rank
def latencies(text: str) -> Dict[int, float]:
    """{size: latency in us} of a demo's printed table (rank 0's)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            out[int(parts[0])] = float(parts[1])
    return out


def rank_main(demodir: str, demo: str, reps: int, out: str) -> None:
    """Run ``osu_<demo>()`` ``reps`` times as written and with the Comm, alternating; rank 0 writes
    {"mpi": [{size: us}...], "pycoll": [...]} to ``out``."""
    import mpi4py
    from mpi4py import MPI

    from pycoll.mpi import Comm

    world = MPI.COMM_WORLD
    swapped = types.ModuleType("mpi4py.MPI")
    swapped.__dict__.update(MPI.__dict__)
    swapped.COMM_WORLD = Comm(world)  # type: ignore[attr-defined]
    sys.path.insert(0, demodir)
    module = __import__(f"osu_{demo}")
    runs: Dict[str, List[Dict[int, float]]] = {"mpi": [], "pycoll": []}
    for rep in range(reps):
        order = ("mpi", "pycoll") if rep % 2 == 0 else ("pycoll", "mpi")
        for which in order:
            mpi4py.MPI = swapped if which == "pycoll" else MPI  # type: ignore[attr-defined]
            module.MPI = mpi4py.MPI  # (what its ``from mpi4py import MPI`` bound)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                getattr(module, f"osu_{demo}")()
            runs[which].append(latencies(printed.getvalue()))
    mpi4py.MPI = MPI  # type: ignore[attr-defined]
    swapped.COMM_WORLD.team.close()
    if world.rank == 0:
        with open(out, "w") as f:
            json.dump(runs, f)


# ------------------------------------------------------------------ the campaign
def fetch(workdir: str) -> str:
    """The demo directory of the installed mpi4py's source distribution (downloaded here)."""
    return os.path.join(os.path.dirname(suite.fetch(workdir)), "demo")


def run_demo(demodir: str, demo: str, n: int, reps: int, timeout: float) -> Optional[Dict[str, Any]]:
    """Rank 0's figures of one demo on ``n`` ranks, or None (the job failed or hung)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "osu.json")
        err = suite.run_job([os.path.abspath(__file__), "--rank", demodir, demo, str(reps), out], n,
                            f"{os.getpid()}.osu.{demo}.{n}", timeout, dict(os.environ))
        try:
            with open(out) as f:
                return json.load(f)
        except (OSError, ValueError):
            print(f"osu_{demo} on {n} ranks failed:\n{err.decode(errors='replace')[-2000:]}", file=sys.stderr)
            return None


def best(runs: List[Dict[str, float]]) -> Dict[int, float]:
    """Per size, the lowest latency of the runs."""
    sizes = sorted({int(s) for r in runs for s in r})
    return {s: min(r[str(s)] for r in runs if str(s) in r) for s in sizes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", default="2,4", help="rank counts (default 2,4)")
    ap.add_argument("--demos", default=",".join(DEMOS), help="osu_<name> demos (default: the collectives)")
    ap.add_argument("--reps", type=int, default=2, help="runs of each side per job (default 2)")
    ap.add_argument("--timeout", type=float, default=600, help="wall-clock limit of one job (s)")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--rank", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        demodir, demo, reps, out = args.rank
        rank_main(demodir, demo, int(reps), out)
        return 0
    everything: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        demodir = fetch(work)
        for n in [int(x) for x in args.n.split(",")]:
            for demo in [d for d in args.demos.split(",") if d]:
                got = run_demo(demodir, demo, n, args.reps, args.timeout)
                if got is None:
                    continue
                mpi, mine = best(got["mpi"]), best(got["pycoll"])
                everything[f"{demo}@{n}"] = {"mpi": mpi, "pycoll": mine}
                print(f"\nosu_{demo}, {n} ranks (latency in us; ratio = pycoll / MPI)")
                print(f"{'size':>9} {'MPI':>10} {'pycoll':>10} {'ratio':>7}")
                for size in mpi:
                    if size in mine:
                        ratio = mine[size] / mpi[size] if mpi[size] else float("nan")
                        print(f"{size:>9} {mpi[size]:>10.2f} {mine[size]:>10.2f} {ratio:>7.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
