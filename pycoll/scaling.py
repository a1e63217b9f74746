"""``pycoll perf COLL -n 2,4,8,16``: one launch per rank count, then one table of vs_mpi (MPI's
time / pycoll's) by collective, size and rank count, and its picture with ``--plot``.

Each rank count runs the ordinary ``pycoll perf`` (its tables printed as they come); this module
only launches them one after the other, collects their JSON and prints the sweep.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any, Callable, Dict, List, Sequence, Tuple

#: Options of ``pycoll perf`` that the sweep sets itself for each launch (with their values).
OWN_OPTIONS = ("-n", "--json", "--plot")
#: The exit statuses of a launch that was interrupted (Ctrl-C, SIGTERM): a sweep stops there.
INTERRUPTED = (130, 143)


def rank_counts(text: str) -> List[int]:
    """``-n``'s value: one rank count, or several separated by commas (``2,4,8,16``)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"-n {text}: rank counts are integers separated by commas (2,4,8,16)") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"-n {text}: rank counts must be at least 1")
    return counts


def without_own_options(argv: Sequence[str]) -> List[str]:
    """``argv`` without the options the sweep sets per launch (``-n 4``, ``-n4``, ``--json=F``...)."""
    out: List[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in OWN_OPTIONS:
            skip = True
            continue
        joined = arg.startswith("-n") and arg[2:].lstrip("=").replace(",", "").isdigit()  # -n4, -n2,4
        if joined or any(arg.startswith(f"{opt}=") for opt in OWN_OPTIONS):
            continue
        out.append(arg)
    return out


def sweep(argv: Sequence[str], counts: Sequence[int],
          launch_one: Callable[[int, List[str]], int]) -> Tuple[int, List[Dict[str, Any]]]:
    """Run ``pycoll perf`` once per rank count (``launch_one(n, argv)`` launches one); returns the
    worst exit status and every row, each with its ``ranks``. A launch ended by Ctrl-C or SIGTERM
    (status 130 or 143) ends the sweep."""
    rows: List[Dict[str, Any]] = []
    status = 0
    base = without_own_options(argv)
    with tempfile.TemporaryDirectory(prefix="pycoll-scaling-") as tmp:
        for n in counts:
            out = os.path.join(tmp, f"n{n}.json")
            print(f"# pycoll perf: {n} ranks", flush=True)
            rc = launch_one(n, [*base, "-n", str(n), "--json", out])
            status = max(status, rc)
            if rc in INTERRUPTED:
                print(f"# pycoll perf: interrupted at {n} ranks", file=sys.stderr, flush=True)
                break
            if not os.path.exists(out):
                print(f"# pycoll perf: {n} ranks wrote no results (exit {rc})", file=sys.stderr, flush=True)
                continue
            with open(out) as f:
                for row in json.load(f)["rows"]:
                    rows.append({**row, "ranks": n})
    return status, rows


def table(rows: List[Dict[str, Any]], counts: Sequence[int]) -> str:
    """The sweep as text: a line per (collective, algorithm, size), a column of vs_mpi per rank
    count ("-": not run at that count, or no MPI time)."""
    cells: Dict[Tuple[str, str, int], Dict[int, Any]] = {}
    for r in rows:
        if "avg_us" not in r:
            continue
        key = (r["coll"], r.get("algorithm", "auto"), r["bytes"])
        cells.setdefault(key, {})[r["ranks"]] = r.get("vs_mpi")
    columns = " ".join(f"{'n=' + str(n):>7}" for n in counts)
    head = f"{'collective':<16} {'algorithm':<10} {'bytes':>10} {columns}"
    lines = ["# scaling: vs_mpi = MPI's time / pycoll's (> 1: pycoll faster), by rank count", head]
    for (coll, alg, nbytes), by_n in cells.items():
        vals = " ".join(f"{by_n[n]:>7.2f}" if by_n.get(n) is not None else f"{'-':>7}" for n in counts)
        lines.append(f"{coll:<16} {alg:<10} {nbytes:>10} {vals}")
    return "\n".join(lines)


def plot(rows: List[Dict[str, Any]], counts: Sequence[int], path: str) -> str:
    """One picture: a panel per collective, vs_mpi against the message size, a line per rank count
    (needs matplotlib). Returns the file written."""
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    colls = list(dict.fromkeys(r["coll"] for r in rows if r.get("vs_mpi") is not None))
    if not colls:
        raise ValueError("nothing to plot: the runs compared with no MPI collective (--compare mpi)")
    cols = min(4, len(colls))
    rows_n = (len(colls) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 3.2 * rows_n), squeeze=False)
    for i, coll in enumerate(colls):
        ax = axes[i // cols][i % cols]
        by_ranks: Dict[int, List[Tuple[int, float]]] = {}
        for r in rows:
            if r["coll"] == coll and r.get("vs_mpi") is not None:
                by_ranks.setdefault(r["ranks"], []).append((max(r["bytes"], 1), r["vs_mpi"]))
        for n, pts in sorted(by_ranks.items()):
            pts.sort()
            ax.semilogx([p[0] for p in pts], [p[1] for p in pts], "o-", markersize=3, label=f"{n} ranks",
                        base=2)
        ax.axhline(1.0, color="k", linewidth=0.8, linestyle="--")
        ax.set_title(coll)
        ax.set_xlabel("bytes")
        ax.set_ylabel("vs MPI")
        ax.legend(fontsize=7)
    for j in range(len(colls), rows_n * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle("pycoll vs MPI by size and rank count (MPI's time / pycoll's; above 1: pycoll faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _size(nbytes: int) -> str:
    for unit, shift in (("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes} B"
