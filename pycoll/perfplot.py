"""Pictures of ``pycoll perf`` results: time and bus bandwidth against size, pycoll next to MPI.

One PNG per collective, two panels: time per call (us, log-log) and busbw (GB/s, log x), a line
for pycoll and, when the run compared, one for MPI's own collective measured in the same run.
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


def plot(rows: List[Dict[str, Any]], metas: List[Dict[str, Any]], path: str) -> List[str]:
    """Draw every collective of a run (``rows`` and ``metas`` as ``pycoll perf --json`` writes
    them); returns the files written."""
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    colls = [m["coll"] for m in metas]
    written = []
    for coll, out in paths_for(path, colls).items():
        meta = next(m for m in metas if m["coll"] == coll)
        mine = sorted((r for r in rows if r.get("coll") == coll and "avg_us" in r), key=lambda r: r["bytes"])
        if not mine:
            continue
        factor = meta.get("bus_factor")
        sizes = [max(r["bytes"], 1) for r in mine]
        fig, axes = plt.subplots(1, 2 if factor else 1, figsize=(11 if factor else 6, 4.2), squeeze=False)
        time_ax = axes[0][0]
        time_ax.loglog(sizes, [r["avg_us"] for r in mine], "o-", label="pycoll")
        if "mpi_us" in mine[0]:
            time_ax.loglog(sizes, [r["mpi_us"] for r in mine], "s--", label=f"MPI {meta.get('mpi') or ''}")
        time_ax.set_xlabel("bytes")
        time_ax.set_ylabel("time per call (us)")
        time_ax.grid(True, which="both", alpha=0.3)
        time_ax.legend()
        if factor:
            bw_ax = axes[0][1]
            bw_ax.semilogx(sizes, [r["busbw"] for r in mine], "o-", label="pycoll")
            if "mpi_algbw" in mine[0]:
                bw_ax.semilogx(sizes, [r["mpi_algbw"] * factor for r in mine], "s--", label="MPI")
            bw_ax.set_xlabel("bytes")
            bw_ax.set_ylabel(f"busbw (GB/s, algbw x {meta.get('factor')})")
            bw_ax.grid(True, which="both", alpha=0.3)
            bw_ax.legend()
        what = f"{coll}, {meta['ranks']} ranks, {meta['dtype']}, algorithm {meta['algorithm']}, " \
               f"transport {meta['transport']}"
        fig.suptitle(f"pycoll perf {what}\n{meta['machine']} ({meta.get('cpus')} cpus)", fontsize=10)
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(out)
    return written
