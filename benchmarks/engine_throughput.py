"""Task completions per second of the progress engine on no-op tasks.

Shapes: a chain (task i waits for task i-1), a wide fan (all tasks independent in one schedule),
and a fan-in/fan-out diamond per 64 tasks. Prints the rates at which schedules of no-op tasks are
built and run (best of ``--repeat``), on one core.

    python benchmarks/engine_throughput.py [--tasks 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import time

from pycoll import Context, Schedule, Task


def build_chain(n: int) -> Schedule:
    sched = Schedule(name="chain")
    prev = None
    for _ in range(n):
        prev = sched.add(Task(), after=prev)
    return sched


def build_fan(n: int) -> Schedule:
    sched = Schedule(name="fan")
    for _ in range(n):
        sched.add(Task())
    return sched


def build_diamonds(n: int, width: int = 64) -> Schedule:
    sched = Schedule(name="diamonds")
    join = None
    for _ in range(0, n, width + 1):
        mids = [sched.add(Task(), after=join) for _ in range(width)]
        join = sched.add(Task(), after=mids)
    return sched


def measure(build, n: int, repeat: int) -> tuple[float, float, int]:
    """Best build and run rates over ``repeat`` runs. Each run starts from a collected heap (the
    previous run's schedule and its reference cycles freed first, as timeit-style benchmarks do);
    the garbage collector stays on while the schedule is built and run."""
    best_build, best_run, count = 0.0, 0.0, 0
    for _ in range(repeat):
        gc.collect()
        ctx = Context(credit_bytes=0, partition_bytes=0, timeout=0)
        t0 = time.perf_counter()
        sched = build(n)
        t1 = time.perf_counter()
        req = ctx.submit(sched)
        req.wait()
        t2 = time.perf_counter()
        count = len(sched.tasks)
        best_build = max(best_build, count / (t1 - t0))
        best_run = max(best_run, count / (t2 - t1))
        del sched, req, ctx
    return best_build, best_run, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'shape':<10} {'tasks':>8} {'build/s':>12} {'completions/s':>14}")
    for label, build in (("chain", build_chain), ("fan", build_fan), ("diamonds", build_diamonds)):
        b, r, count = measure(build, args.tasks, args.repeat)
        print(f"{label:<10} {count:>8} {b:>12,.0f} {r:>14,.0f}")


if __name__ == "__main__":
    main()
