"""Reading, finding and merging trace files (``pycoll trace merge``)."""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Dict, Iterable, List

from pycoll.errors import PycollError
from pycoll.trace import rank_path, write_json

_RANK_RE = re.compile(r"\.rank(\d+)(?:\.[^./]*)?$")


def _rank_key(path: str) -> tuple:
    m = _RANK_RE.search(path)
    return (0, int(m.group(1)), path) if m else (1, 0, path)


def expand(inputs: Iterable[str]) -> List[str]:
    """The trace files named by ``inputs``: files, globs (``trace.rank*.json``), templates with
    ``{rank}``, or the ``PYCOLL_TRACE`` value itself (``trace.json``: all ``trace.rank*.json``
    if there are any, else the file). Ordered by rank, without repeats."""
    found: List[str] = []
    for item in inputs:
        if "{rank}" in item:
            matches = glob.glob(glob.escape(item).replace(glob.escape("{rank}"), "*"))
        elif glob.has_magic(item):
            matches = glob.glob(item)
        else:
            matches = glob.glob(rank_path(glob.escape(item), "*"))
            if not matches and os.path.isfile(item):
                matches = [item]
        if not matches:
            raise PycollError(f"no trace files match {item!r} (give files, a glob, or the PYCOLL_TRACE "
                              f"value, e.g. trace.json for trace.rank*.json)")
        for path in sorted(matches, key=_rank_key):
            if path not in found:
                found.append(path)
    return found


def load(path: str) -> Dict[str, Any]:
    """A trace document (the JSON Array Format is wrapped as ``{"traceEvents": [...]}``)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise PycollError(f"cannot read trace {path}: {exc}") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise PycollError(f"{path} is not a Chrome trace (no traceEvents list)")
    return doc


def merge_docs(paths: List[str]) -> Dict[str, Any]:
    """One document with every file's events, ``pid`` = rank and a ``process_name`` "rank N"
    per rank (files already merged keep their pids)."""
    events: List[dict] = []
    meta: List[dict] = []
    sources: List[dict] = []
    used: set = set()
    for path in paths:
        doc = load(path)
        other = doc.get("otherData") or {}
        if other.get("merged"):
            events.extend(doc["traceEvents"])
            sources.extend(other["merged"])
            used.update(e.get("pid") for e in doc["traceEvents"])
            continue
        rank = other.get("rank")
        if rank is None:
            m = _RANK_RE.search(path)
            pids = {e.get("pid") for e in doc["traceEvents"] if "pid" in e}
            rank = int(m.group(1)) if m else (pids.pop() if len(pids) == 1 else len(sources))
        label = f"pid {rank}" if other.get("rank_source") == "pid" else f"rank {rank}"
        pid = rank
        if pid in used:  # two files claim one rank (two runs, or pids that collide)
            pid = max(p for p in used if isinstance(p, int)) + 1
            label = f"{label} ({os.path.basename(path)})"
        used.add(pid)
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid if isinstance(pid, int) else 0}})
        for ev in doc["traceEvents"]:
            if ev.get("ph") == "M" and ev.get("name") in ("process_name", "process_sort_index"):
                continue
            ev = dict(ev)
            ev["pid"] = pid
            events.append(ev)
        sources.append({"file": path, "pid": pid, "rank": rank, "host": other.get("host"),
                        "process": other.get("pid"), "wall_start_us": other.get("wall_start_us")})
    events.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0)))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"pycoll_trace": 1, "merged": sources}}


def merge(inputs: Iterable[str], out: str) -> List[str]:
    """``pycoll trace merge``: combine the trace files named by ``inputs`` into ``out``; returns
    the files merged."""
    paths = [p for p in expand(inputs) if os.path.abspath(p) != os.path.abspath(out)]
    if not paths:
        raise PycollError("nothing to merge (the only file found is the output itself)")
    write_json(merge_docs(paths), out)
    return paths


__all__ = ["expand", "load", "merge", "merge_docs", "write_json"]
