"""Pictures of ``pycoll perf`` results: time and bus bandwidth against size, pycoll next to MPI.

One PNG per collective, two panels: time per call (us, log-log) and busbw (GB/s, log x), a line
for pycoll (one per algorithm after ``--algorithm all``) and, when the run compared, one for MPI's
own collective measured in the same run.
matplotlib is an optional dependency (``pip install pycoll[plot]``): it is imported when a picture
is drawn.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence


def paths_for(path: str, colls: Sequence[str]) -> Dict[str, str]:
    """The PNG of each collective: ``path`` itself for one collective, ``stem_<coll>.png`` for
    several."""
    if len(colls) == 1:
        return {colls[0]: path}
    stem, ext = os.path.splitext(path)
    return {c: f"{stem}_{c}{ext or '.png'}" for c in colls}


def plot(rows: List[Dict[str, Any]], metas: List[Dict[str, Any]], path: str,
         title: str = "pycoll perf") -> List[str]:
    """Draw every collective of a run (``rows`` and ``metas`` as ``pycoll perf --json`` writes
    them; ``pycoll sim`` passes its rows as such, titled ``pycoll sim``); returns the files written."""
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    colls = list(dict.fromkeys(m["coll"] for m in metas))
    written = []
    for coll, out in paths_for(path, colls).items():
        meta = next(m for m in metas if m["coll"] == coll)
        mine = [r for r in rows if r.get("coll") == coll and "avg_us" in r]
        if not mine:
            continue
        runs: Dict[str, List[Dict[str, Any]]] = {}  # algorithm -> its rows by size
        for r in sorted(mine, key=lambda r: r["bytes"]):
            runs.setdefault(r.get("algorithm", meta["algorithm"]), []).append(r)
        factor = meta.get("bus_factor")
        fig, axes = plt.subplots(1, 2 if factor else 1, figsize=(11 if factor else 6, 4.2), squeeze=False)
        time_ax = axes[0][0]
        bw_ax = axes[0][1] if factor else None
        for name, got in runs.items():
            label = "pycoll" if len(runs) == 1 else f"pycoll {name}"
            sizes = [max(r["bytes"], 1) for r in got]
            time_ax.loglog(sizes, [r["avg_us"] for r in got], "o-", label=label, markersize=3)
            if bw_ax is not None:
                bw_ax.semilogx(sizes, [r["busbw"] for r in got], "o-", label=label, markersize=3)
        ref = next(iter(runs.values()))  # MPI's times, from the first run (auto when all ran)
        if "mpi_us" in ref[0]:
            sizes = [max(r["bytes"], 1) for r in ref]
            time_ax.loglog(sizes, [r["mpi_us"] for r in ref], "s--k", label=f"MPI {meta.get('mpi') or ''}",
                           markersize=3)
            if bw_ax is not None and "mpi_algbw" in ref[0]:
                bw_ax.semilogx(sizes, [r["mpi_algbw"] * factor for r in ref], "s--k", label="MPI",
                               markersize=3)
        time_ax.set_xlabel("bytes")
        time_ax.set_ylabel("time per call (us)")
        time_ax.grid(True, which="both", alpha=0.3)
        time_ax.legend(fontsize=8)
        if bw_ax is not None:
            bw_ax.set_xlabel("bytes")
            bw_ax.set_ylabel(f"busbw (GB/s, algbw x {meta.get('factor')})")
            bw_ax.grid(True, which="both", alpha=0.3)
            bw_ax.legend(fontsize=8)
        algorithm = "all" if len(runs) > 1 else meta["algorithm"]
        what = f"{coll}, {meta['ranks']} ranks, {meta['dtype']}, algorithm {algorithm}, " \
               f"transport {meta['transport']}"
        cpus = f" ({meta['cpus']} cpus)" if meta.get("cpus") else ""
        fig.suptitle(f"{title} {what}\n{meta['machine']}{cpus}", fontsize=10)
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(out)
    return written
