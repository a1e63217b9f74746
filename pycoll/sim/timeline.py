"""A simulated run's timeline in the Trace Event Format that ``PYCOLL_TRACE`` writes (load it in
https://ui.perfetto.dev or ``chrome://tracing``): one process per rank, each instruction a
complete event from when it was issued to when it was done (a send: posted to left; a receive:
posted to arrived; a reduction or copy: its compute; a call's start, ``pycoll sim --calls``), on
as many lanes as overlap. Times are the simulated microseconds from the start."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from pycoll.trace import write_json

_NAMES = ("send", "recv", "reduce", "copy", "avg", "call")  # (pycoll.sim.engine's kinds, in order)
_CATS = ("comm", "comm", "subtask", "subtask", "subtask", "subtask")


def document(spans: Sequence[Tuple[int, int, int, int, float, float]], title: str) -> Dict[str, Any]:
    """The trace document of ``spans`` (rank, kind, peer, bytes, issued, done: seconds), as
    :func:`pycoll.sim.engine.run` records them."""
    events: List[Dict[str, Any]] = []
    lanes: Dict[int, List[float]] = {}  # rank -> the end of each lane's last span
    for rank, kind, peer, nbytes, t0, t1 in sorted(spans, key=lambda s: (s[0], s[4], s[5])):
        ends = lanes.setdefault(rank, [])
        lane = next((k for k, end in enumerate(ends) if end <= t0), len(ends))
        if lane == len(ends):
            ends.append(t1)
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": lane,
                           "args": {"name": f"lane {lane}"}})
        ends[lane] = t1
        name = _NAMES[kind] + (f" {'to' if kind == 0 else 'from'} {peer}" if kind < 2 else "")
        events.append({"ph": "X", "name": name, "cat": _CATS[kind], "pid": rank, "tid": lane,
                       "ts": t0 * 1e6, "dur": (t1 - t0) * 1e6, "args": {"bytes": nbytes, "peer": peer}})
    for rank in lanes:
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"simulated": title}}


def write(spans: Sequence[Tuple[int, int, int, int, float, float]], title: str, path: str) -> None:
    """Write the timeline of ``spans`` to ``path``."""
    write_json(document(spans, title), path)
