"""Priority scheduling against FIFO, made visible with PYCOLL_TRACE and ``pycoll trace plot``.

A training step's backward pass hands gradients to communication from the output layer back to
the input layer, so the large, least urgent gradients are posted first; the next forward pass
needs the small input-layer ones first. Under a credit (``PYCOLL_CREDIT_BYTES``: bytes in flight
per process) only one collective goes at a time here and the rest wait in the engine's queue,
which starts the lowest ``priority=`` first (FIFO among equals).

This program posts the same five allreduces twice, under a 64 KiB credit and with the timeline
traced: once with priorities (the urgent ones 0, the bulk 1), once all equal (FIFO). It prints the
order in which each run started them: with priorities the urgent ones jump the queue (only the
bulk one posted first, already on the wire, goes before them). Then rank 0 merges the ranks'
traces and draws the timeline (queue waits and communication, per rank) into a PNG.

    mpiexec -n 2 python examples/scheduling_trace.py [--png timeline.png]

The same from the command line, for any traced program::

    PYCOLL_TRACE=trace.json PYCOLL_CREDIT_BYTES=64K mpiexec -n 2 python prog.py
    pycoll trace merge trace.json -o merged.json      # trace.rank0.json, trace.rank1.json, ...
    pycoll trace plot merged.json -o timeline.png     # needs matplotlib
"""

import argparse
import json
import os
import tempfile

import numpy as np
from mpi4py import MPI

import pycoll
import pycoll.trace
from pycoll.trace.files import merge
from pycoll.trace.plot import plot

#: (name, float32 elements, priority): in the order backward produces them. Lower priority is
#: more urgent. Every size differs, so that a collective is known in the trace by its bytes.
GRADIENTS = [("bulk0", 64 << 10, 1), ("bulk1", 48 << 10, 1), ("bulk2", 32 << 10, 1),
             ("urgent0", 1 << 10, 0), ("urgent1", 2 << 10, 0)]


def run(team: pycoll.Team, label: str, priorities: bool) -> None:
    """Post every gradient's allreduce, then wait for them all; check the sums."""
    arrays, reqs = [], []
    for name, count, prio in GRADIENTS:
        arr = np.full(count, team.rank + 1.0, dtype=np.float32)
        # tag=: collectives matched by name, which the engine may start in any order (untagged ones
        # on one host would run in posting order on the shared segment, outside the credit).
        reqs.append(team.allreduce(arr, tag=f"{label}/{name}", priority=prio if priorities else 0))
        arrays.append(arr)
    pycoll.wait_all(reqs)
    assert all(np.all(a == sum(range(1, team.size + 1))) for a in arrays)


def started_order(events: list, t0: float, t1: float) -> list:
    """The gradients whose allreduce the trace ``events`` show starting between ``t0`` and ``t1``
    (trace timestamps, µs), in the order they started."""
    by_bytes = {count * 4: name for name, count, _ in GRADIENTS}
    # comm spans: what the engine started (collectives, and their parts when they are partitioned)
    spans = [e for e in events if e.get("ph") == "X" and e["cat"] == "comm" and t0 <= e["ts"] < t1
             and e["name"].startswith("allreduce:")]
    return [by_bytes.get(e["args"]["nbytes"], e["name"]) for e in sorted(spans, key=lambda e: e["ts"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--png", help="the timeline picture (default: in a new temporary directory)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    # Settings are read from the environment, before the team is made; a launcher would set them
    # (PYCOLL_CREDIT_BYTES=64K PYCOLL_TRACE=... mpiexec ...).
    os.environ.setdefault("PYCOLL_CREDIT_BYTES", "64K")  # a quarter of the largest gradient
    # Off: the check that ranks agree on a call, which pycoll puts in front of a tag's first uses,
    # would add its own spans to the picture. Leave it on in real programs (PYCOLL_CHECK=auto).
    os.environ.setdefault("PYCOLL_CHECK", "off")
    if not os.environ.get("PYCOLL_TRACE"):
        trace_dir = comm.bcast(tempfile.mkdtemp(prefix="pycoll-trace-") if rank == 0 else None)
        os.environ["PYCOLL_TRACE"] = os.path.join(trace_dir, "trace.json")
    team = pycoll.Team.from_mpi(comm)
    tracer = pycoll.trace.tracer()

    team.barrier().wait()
    tracer.step(0)  # the plot's time axis starts at step 0's mark
    for label, priorities in (("priority", True), ("fifo", False)):
        team.barrier().wait()
        tracer.instant(f"{label} run", cat="mark")  # shows in Perfetto; splits the runs below
        run(team, label, priorities)
    team.barrier().wait()
    path = pycoll.trace.flush()  # this rank's file (trace.rank<r>.json); also written at exit
    comm.Barrier()
    if rank != 0:
        return

    with open(path) as f:  # rank 0's timeline
        events = json.load(f)["traceEvents"]
    runs = sorted(e["ts"] for e in events if e.get("cat") == "mark")  # where each run began
    orders = {"priority": started_order(events, runs[0], runs[1]),
              "fifo": started_order(events, runs[1], float("inf"))}
    for label, order in orders.items():
        print(f"{label:>8} run started: {' '.join(order)}", flush=True)

    # Merge the ranks' files (pid = rank) and draw them: what `pycoll trace merge` and `pycoll
    # trace plot` do.
    merged = os.path.join(os.path.dirname(path), "merged.json")
    merge([os.environ["PYCOLL_TRACE"]], merged)
    png = args.png or os.path.join(os.path.dirname(path), "timeline.png")
    drawn = plot([merged], png, step=0, title="left: priorities, started " + " ".join(orders["priority"])
                 + "; right: FIFO, started " + " ".join(orders["fifo"]))
    print(f"timeline of {drawn['ranks']} ranks, {drawn['ms']:.1f} ms: {png} (open {merged} in "
          "https://ui.perfetto.dev for every span's details)", flush=True)


if __name__ == "__main__":
    main()
