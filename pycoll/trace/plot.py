"""``pycoll trace plot``: a Gantt chart (PNG) of one training step from trace files.

One row group per rank; one row per lane of the trace (engine lanes hold no overlapping spans;
spans that nest in a program thread's lane go on rows below it); bars coloured by category (queue
wait, communication, forward, backward, ...); the time axis in ms from the step's start (the
earliest rank's ``step N`` mark) to the next step's mark. Needs matplotlib (drawn with the Agg
backend, without pyplot, so it never touches the caller's backend).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

from pycoll.errors import PycollError
from pycoll.trace.files import expand, merge_docs

#: Colours of the categories the plot knows (others get tab10 colours).
COLOURS = {
    "forward": "#43a047",
    "backward": "#e53935",
    "compute": "#8d8d8d",
    "update": "#8e24aa",
    "comm": "#1e88e5",
    "queue": "#ffb300",
    "subtask": "#90caf9",
}
LABELS = {"comm": "communication", "queue": "queue wait", "subtask": "subtasks (send/recv/reduce)"}
_ORDER = ["forward", "backward", "update", "compute", "comm", "queue", "subtask"]


def _matplotlib() -> Any:
    # optional (pycoll[plot]): imported only when a plot is drawn
    try:
        import matplotlib  # noqa: F401, PLC0415
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
        from matplotlib.patches import Patch  # noqa: PLC0415
    except ImportError:
        raise PycollError("pycoll trace plot needs matplotlib: pip install matplotlib "
                          "(or pip install 'pycoll[plot]')") from None
    return Figure, FigureCanvasAgg, Patch


def steps_of(events: List[dict]) -> Dict[Any, Dict[int, float]]:
    """``{pid: {step: ts}}`` from the ``step N`` marks."""
    marks: Dict[Any, Dict[int, float]] = {}
    for e in events:
        if e.get("ph") in ("i", "I") and e.get("cat") == "step":
            n = (e.get("args") or {}).get("step")
            if n is None:
                try:
                    n = int(str(e.get("name", "")).split()[-1])
                except ValueError:
                    continue
            marks.setdefault(e.get("pid"), {}).setdefault(int(n), float(e["ts"]))
    return marks


def window(events: List[dict], step: Optional[int],
           whole: bool = False) -> Tuple[float, float, Optional[int], Dict]:
    """``(t0, t1, step, marks)``: the span of ``step`` (default: a middle step if there are step
    marks, else the whole trace; ``whole``: the whole trace, marks or not)."""
    marks = steps_of(events)
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise PycollError("the trace has no spans to plot")
    end = max(float(e["ts"]) + float(e.get("dur", 0)) for e in spans)
    begin = min(float(e["ts"]) for e in spans)
    numbers = sorted({n for m in marks.values() for n in m})
    if whole:
        if step is not None:
            raise PycollError("a step or the whole trace, not both")
        return begin, end, None, marks
    if step is None:
        if not numbers:
            return begin, end, None, marks
        complete = numbers[:-1] or numbers  # steps with a next mark to end them
        step = complete[len(complete) // 2]
    elif step not in numbers:
        have = ", ".join(map(str, numbers)) if numbers else "none (the program calls Tracer.step(n))"
        raise PycollError(f"no step {step} in the trace; steps marked: {have}")
    t0 = min(m[step] for m in marks.values() if step in m)
    nexts = []
    for m in marks.values():
        later = [n for n in m if n > step]
        if later:
            nexts.append(m[min(later)])
    t1 = max(nexts) if nexts else end
    return t0, t1, step, marks


def _rows(events: List[dict], t0: float, t1: float, cats: Optional[set]) -> Dict[tuple, List[dict]]:
    """``{(pid, tid, depth): spans}`` of the spans in [t0, t1] (depth: nesting level in the lane)."""
    by_lane: Dict[tuple, List[dict]] = {}
    for e in events:
        if e.get("ph") == "X" and (cats is None or e.get("cat") in cats):
            by_lane.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    rows: Dict[tuple, List[dict]] = {}
    for (pid, tid), spans in by_lane.items():
        spans.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack: List[float] = []
        for e in spans:
            ts = float(e["ts"])
            te = ts + float(e.get("dur", 0))
            while stack and stack[-1] <= ts:
                stack.pop()
            depth = len(stack)
            stack.append(te)
            if te >= t0 and ts <= t1:
                rows.setdefault((pid, tid, depth), []).append(e)
    return rows


def plot(inputs: Iterable[str], out: str, step: Optional[int] = None, subtasks: bool = False,
         title: Optional[str] = None, whole: bool = False) -> Dict[str, Any]:
    """Draw one step of the traces named by ``inputs`` (see :func:`pycoll.trace.files.expand`)
    into the PNG ``out`` (``whole``: all of it, steps marked or not); returns what was drawn
    (step, window in ms, ranks, rows)."""
    Figure, FigureCanvasAgg, Patch = _matplotlib()
    paths = expand(inputs)
    doc = merge_docs(paths)
    events = doc["traceEvents"]
    t0, t1, step, marks = window(events, step, whole)
    hidden = set() if subtasks else {"subtask"}
    cats = {e.get("cat") for e in events if e.get("ph") == "X"} - hidden
    rows = _rows(events, t0, t1, cats)
    if not rows:
        raise PycollError("nothing to draw in that window")
    lane_names: Dict[tuple, str] = {}
    rank_names: Dict[Any, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            lane_names[(e.get("pid"), e.get("tid"))] = (e.get("args") or {}).get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "process_name":
            rank_names[e.get("pid")] = (e.get("args") or {}).get("name", "")

    def order(key: tuple) -> tuple:
        return tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in key)

    keys = sorted(rows, key=order)
    pids = sorted({k[0] for k in keys}, key=lambda p: order((p,)))
    # y positions, top to bottom, a gap between ranks
    ypos: Dict[tuple, float] = {}
    groups: Dict[Any, Tuple[float, float]] = {}
    y = 0.0
    for pid in pids:
        first = y
        for key in keys:
            if key[0] == pid:
                ypos[key] = y
                y += 1.0
        groups[pid] = (first, y - 1.0)
        y += 0.6
    n_rows = len(keys)
    height = min(120.0, max(3.0, 0.26 * n_rows + 0.35 * len(pids) + 1.8))
    fig = Figure(figsize=(13, height))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    extra = iter(["#00897b", "#6d4c41", "#d81b60", "#3949ab", "#7cb342", "#f4511e"])
    colours = dict(COLOURS)
    seen: List[str] = []
    scale = 1e-3  # us -> ms
    for key in keys:
        by_cat: Dict[tuple, list] = {}
        for e in rows[key]:
            ts = max(float(e["ts"]), t0)
            te = min(float(e["ts"]) + float(e.get("dur", 0)), t1)
            if te < ts:
                continue
            cat = e.get("cat") or "?"
            bad = (e.get("args") or {}).get("outcome") in ("error", "canceled")
            by_cat.setdefault((cat, bad), []).append(((ts - t0) * scale, (te - ts) * scale))
        for (cat, bad), bars in by_cat.items():
            if cat not in colours:
                colours[cat] = next(extra, "#bdbdbd")
            if cat not in seen:
                seen.append(cat)
            ax.broken_barh(bars, (ypos[key] - 0.4, 0.8), facecolors=colours[cat], linewidth=0.3,
                           edgecolor="black" if bad else "white", hatch="///" if bad else None)
    labels = []
    for key in keys:
        pid, tid, depth = key
        name = lane_names.get((pid, tid), f"tid {tid}")
        if depth:
            name = f"{name} +{depth}"
        if ypos[key] == groups[pid][0]:
            name = f"{rank_names.get(pid, f'rank {pid}')} | {name}"
        labels.append(name)
    ax.set_yticks([ypos[k] for k in keys])
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(y - 0.6 + 0.2, -0.8)
    span_ms = (t1 - t0) * scale
    ax.set_xlim(0, span_ms if span_ms > 0 else 1)
    for i, pid in enumerate(pids):
        lo, hi = groups[pid]
        if i % 2:
            ax.axhspan(lo - 0.5, hi + 0.5, color="#f3f3f3", zorder=0)
        if step is not None and step in marks.get(pid, {}):
            x = (marks[pid][step] - t0) * scale
            ax.vlines(x, lo - 0.5, hi + 0.5, colors="black", linestyles="dashed", linewidth=0.8)
    ax.set_xlabel(f"ms since the start of step {step}" if step is not None else "ms since the trace start")
    ax.grid(axis="x", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)
    if title is None:
        what = f"step {step}" if step is not None else "whole trace"
        title = f"pycoll trace: {what}, {span_ms:.3f} ms, {len(pids)} rank{'s' if len(pids) != 1 else ''}"
    ax.set_title(title, fontsize=10)
    cats_drawn = sorted(seen, key=lambda c: (_ORDER.index(c) if c in _ORDER else len(_ORDER), c))
    handles = [Patch(facecolor=colours[c], label=LABELS.get(c, c)) for c in cats_drawn]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return {"file": out, "step": step, "ms": span_ms, "ranks": len(pids), "rows": n_rows, "inputs": paths}


__all__ = ["plot", "steps_of", "window"]
