"""Chaos campaign: kill one rank at a random moment and measure how fast the others know.

Each trial starts ``-n`` ranks on this host around a TCP store (``Team.from_store``; the shared
segment, or the transports ``PYCOLL_TLS`` names), runs a random sequence of collectives checked
against numpy, and makes one random rank leave at a random call in one of these ways:

- ``sigkill``: SIGKILL in the middle of a collective (posted, partly done);
- ``os_exit``: ``os._exit(3)`` between calls (no atexit, no exception: the process is gone);
- ``raise``: an uncaught exception between calls;
- ``sys_exit``: ``sys.exit(0)`` between calls (the interpreter exits normally);
- ``close``: the rank closes its team and lives on (sleeps; killed at the end of the trial).

The others must raise a pycoll error (not hang, not return a wrong result). With ``--shrink`` they
then go on, as :mod:`pycoll.recovery` says: revoke the team, shrink it to the survivors and check
an allreduce on the new team; the seconds from the moment the victim left to that allreduce's
result are reported too (a survivor that could not go on counts as a failure). Reported per way:
trials, detection time on the survivors (from the moment the victim left to each survivor's
error; median and max), hangs (a survivor still running at the trial's limit, or one that
finished without noticing), timeouts (survivors that only timed out), wrong results, and
leftovers (files in /dev/shm or /tmp that the trial's own processes made and left, as
:mod:`pycoll.leftovers` tells them from other programs'; removed after counting). The exit status
is 1 if any trial hung, gave a wrong result, left something behind or took longer than
``--max-detection`` to be noticed.

    python benchmarks/chaos.py                   # 100 trials, 4 ranks, every way (shared segment)
    python benchmarks/chaos.py --quick           # 10 trials, two of each way (the test suite's)
    python benchmarks/chaos.py --shrink          # ... and the survivors shrink and go on
    PYCOLL_TLS=tcp python benchmarks/chaos.py    # point to point over TCP, no segment
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict

WAYS = ("sigkill", "os_exit", "raise", "sys_exit", "close")
#: marks a trial's processes in their environment (pycoll.leftovers.JobFiles)
TRIAL_VAR = "PYCOLL_CHAOS_TRIAL"
COLLS = ("allreduce", "bcast", "allgather", "alltoall", "gather", "scatter", "reduce", "barrier")


# ------------------------------------------------------------------ one rank
def rank_main(rank: int, size: int, port: int, seed: int, victim: int, way: str, die_at: int,
              calls: int, shrink: bool = False) -> None:
    import numpy as np

    import pycoll
    from pycoll import Team
    from pycoll.store import TCPStore

    team = Team.from_store(TCPStore("127.0.0.1", port, timeout=30), rank, size)
    rng = random.Random(seed)  # the same sequence on every rank
    for i in range(calls):
        coll = rng.choice(COLLS)
        count = rng.choice((1, 7, 1000, 70_000, 300_000))
        root = rng.randrange(size)
        x = np.arange(count, dtype=np.float64) + rank
        if rank == victim and i == die_at and way != "sigkill":
            leave(team, way)
        try:
            t0 = time.time()
            if rank == victim and i == die_at:  # sigkill: in the middle of the collective
                if team.shared is not None:
                    team.shared.polls = 1  # give up waiting at once: the collective stays half done
                req = post(team, coll, x, count, root, size)
                req.test()
                print(json.dumps({"rank": rank, "left": time.time()}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            out = post(team, coll, x, count, root, size).wait()
            if not check(coll, out, count, root, rank, size, np):
                print(json.dumps({"rank": rank, "wrong": f"{coll} #{i}"}), flush=True)
                return
        except pycoll.PycollError as exc:
            kind = type(exc).__name__
            print(json.dumps({"rank": rank, "error": time.time(), "kind": kind, "call": i,
                              "since_call": time.time() - t0, "text": str(exc)[:300]}), flush=True)
            if shrink:
                go_on(team, rank, size, victim)
            return
    print(json.dumps({"rank": rank, "finished": True}), flush=True)


def go_on(team: Any, rank: int, size: int, victim: int) -> None:
    """Revoke, shrink to the survivors, and check an allreduce on the new team."""
    import numpy as np

    import pycoll

    try:
        team.revoke(f"rank {rank} saw a failure")
        new = team.shrink()
        y = np.array([float(rank)])
        new.allreduce(y).wait()
        ok = new.size == size - 1 and y[0] == sum(range(size)) - victim
        print(json.dumps({"rank": rank, "recovered": time.time(), "members": new.size, "ok": bool(ok)}),
              flush=True)
        new.close()
    except pycoll.PycollError as exc:
        print(json.dumps({"rank": rank, "unrecovered": f"{type(exc).__name__}: {exc}"[:300]}), flush=True)


def leave(team: Any, way: str) -> None:
    """Leave the team in ``way`` (between calls), having said when."""
    print(json.dumps({"rank": team.rank, "left": time.time()}), flush=True)
    if way == "os_exit":
        os._exit(3)
    if way == "raise":
        raise RuntimeError(f"chaos: rank {team.rank} raises")
    if way == "sys_exit":
        sys.exit(0)
    if way == "close":
        team.close()
        time.sleep(600)


def post(team: Any, coll: str, x: Any, count: int, root: int, size: int) -> Any:
    """Post ``coll`` on ``x`` (``count`` elements, every rank's ``arange + rank``): its request."""
    import numpy as np

    if coll == "allreduce":
        return team.allreduce(x, np.empty_like(x))
    if coll == "reduce":
        return team.reduce(x, np.empty_like(x) if team.rank == root else None, root=root)
    if coll == "bcast":
        return team.bcast(x, root=root)
    if coll == "allgather":
        return team.allgather(x, np.empty(size * count))
    if coll == "alltoall":
        return team.alltoall(np.tile(x, size), np.empty(size * count))
    if coll == "gather":
        return team.gather(x, np.empty(size * count) if team.rank == root else None, root=root)
    if coll == "scatter":
        src = np.tile(np.arange(count, dtype=np.float64) + root, size) if team.rank == root else None
        return team.scatter(src, np.empty(count), root=root)
    return team.barrier()


def check(coll: str, out: Any, count: int, root: int, rank: int, size: int, np: Any) -> bool:
    """Whether ``out`` is what numpy says this rank holds after ``coll``."""
    base = np.arange(count, dtype=np.float64)
    if coll in ("allreduce",) or (coll == "reduce" and rank == root):
        return np.array_equal(out, base * size + sum(range(size)))
    if coll == "bcast":
        return np.array_equal(out, base + root)
    if coll == "allgather" or (coll == "gather" and rank == root):
        return np.array_equal(out, np.concatenate([base + r for r in range(size)]))
    if coll == "alltoall":
        return np.array_equal(out, np.concatenate([base + r for r in range(size)]))
    if coll == "scatter":
        return np.array_equal(out, base + root)
    return True


# ------------------------------------------------------------------ the campaign
def trial(size: int, seed: int, way: str, limit: float, timeout: float, shrink: bool = False) -> Dict:
    """One trial: the ranks' reports, and what went wrong."""
    from pycoll.leftovers import JobFiles
    from pycoll.store import TCPStore

    rng = random.Random(seed)
    victim, calls = rng.randrange(size), 12
    die_at = rng.randrange(2, calls - 2)
    server = TCPStore(port=0, is_master=True, timeout=30)
    mark = f"{os.getpid()}.{seed}"  # (the trial's processes carry it: their files are counted, no others)
    files = JobFiles(TRIAL_VAR, mark).watch()
    env = dict(os.environ, PYCOLL_TIMEOUT=str(timeout), **{TRIAL_VAR: mark})
    argv = [str(size), str(server.port), str(seed), str(victim), way, str(die_at), str(calls),
            str(int(shrink))]
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), *argv],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                              start_new_session=True) for r in range(size)]
    deadline = time.monotonic() + limit
    reports: Dict[int, Dict] = {}
    hung = []
    # the survivors first; then the victim (one that closed its team lives on: it is ended now)
    for r in sorted(range(size), key=lambda q: q == victim):
        p = procs[r]
        try:
            wait = 0.1 if r == victim and way == "close" else max(0.1, deadline - time.monotonic())
            out = p.communicate(timeout=wait)[0]
        except subprocess.TimeoutExpired:
            if not (r == victim and way == "close"):
                hung.append(r)
            os.killpg(p.pid, signal.SIGKILL)
            out = p.communicate()[0]
        for line in out.splitlines():
            if line.startswith("{"):
                reports.setdefault(r, {}).update(json.loads(line))
    server.close()
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    left = reports.get(victim, {}).get("left")
    detections, wrong, timeouts, recoveries, unrecovered = [], [], [], [], []
    for r in range(size):
        if r == victim:
            continue
        rep = reports.get(r, {})
        if shrink and rep.get("ok") and left is not None:
            recoveries.append(max(0.0, rep["recovered"] - left))
        elif shrink and "error" in rep:
            unrecovered.append(r)
        if "wrong" in rep:
            wrong.append(r)
        if rep.get("kind") == "TimeoutError":
            timeouts.append(r)
        if "error" in rep and left is not None:
            detections.append(max(0.0, rep["error"] - left))
        elif "error" not in rep and r not in hung:
            hung.append(r)  # finished without noticing: cannot be (the victim never came)
    time.sleep(0.1)
    files.stop()
    leftovers = files.present()
    files.remove()
    return {"way": way, "victim": victim, "die_at": die_at, "detections": detections, "hung": hung,
            "recoveries": recoveries, "unrecovered": unrecovered,
            "timeouts": timeouts, "wrong": wrong, "leftovers": leftovers,
            "texts": sorted({reports.get(r, {}).get("text", "")[:120] for r in range(size) if r != victim})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=4, help="ranks per trial (default 4)")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="10 trials, two of each way")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=20.0, help="PYCOLL_TIMEOUT of the ranks")
    ap.add_argument("--shrink", action="store_true",
                    help="the survivors revoke, shrink and check an allreduce on the new team")
    ap.add_argument("--json", help="write every trial here")
    ap.add_argument("--max-detection", type=float, default=1.0,
                    help="a detection slower than this (seconds) fails the campaign (default 1)")
    ap.add_argument("--max-recovery", type=float, default=2.0,
                    help="with --shrink: going on later than this (seconds) fails the campaign (default 2)")
    args = ap.parse_args()
    trials = 10 if args.quick else args.trials
    results = []
    for t in range(trials):
        way = WAYS[t % len(WAYS)]
        res = trial(args.n, args.seed * 1000 + t, way, limit=args.timeout + 30, timeout=args.timeout,
                    shrink=args.shrink)
        results.append(res)
        print(f"trial {t:3d} {way:<8} victim {res['victim']} at call {res['die_at']}: detected in "
              + (", ".join(f"{d:.3f}" for d in res["detections"]) or "-") + " s"
              + ("; went on in " + (", ".join(f"{d:.3f}" for d in res["recoveries"]) or "-") + " s"
                 if args.shrink else "")
              + "".join(f"; {k} {res[k]}" for k in ("hung", "timeouts", "wrong", "leftovers", "unrecovered")
                        if res[k]),
              flush=True)
    print(f"\n{args.n} ranks, {trials} trials, transports {os.environ.get('PYCOLL_TLS', 'default')}")
    print(f"{'way':<9} {'trials':>6} {'median_s':>9} {'max_s':>7} {'hangs':>6} {'timeouts':>8} {'wrong':>6} "
          f"{'leftovers':>9}" + (f" {'went_on_median_s':>16} {'went_on_max_s':>13} {'not_on':>6}"
                                 if args.shrink else ""))
    bad = 0
    for way in WAYS:
        rs = [r for r in results if r["way"] == way]
        if not rs:
            continue
        ds = [d for r in rs for d in r["detections"]]
        hangs = sum(len(r["hung"]) for r in rs)
        touts = sum(len(r["timeouts"]) for r in rs)
        wrong = sum(len(r["wrong"]) for r in rs)
        leftovers = sum(len(r["leftovers"]) for r in rs)
        bad += hangs + wrong + leftovers + sum(d > args.max_detection for d in ds)
        line = (f"{way:<9} {len(rs):>6} {statistics.median(ds) if ds else float('nan'):>9.3f} "
                f"{max(ds) if ds else float('nan'):>7.3f} {hangs:>6} {touts:>8} {wrong:>6} {leftovers:>9}")
        if args.shrink:
            rec = [d for r in rs for d in r["recoveries"]]
            stuck = sum(len(r["unrecovered"]) for r in rs)
            bad += stuck + sum(d > args.max_recovery for d in rec)
            line += (f" {statistics.median(rec) if rec else float('nan'):>16.3f} "
                     f"{max(rec) if rec else float('nan'):>13.3f} {stuck:>6}")
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if bad:
        print(f"FAILED: {bad} hangs, wrong results, leftovers, detections over {args.max_detection:g} s"
              + (f" or survivors that did not go on within {args.max_recovery:g} s" if args.shrink else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        a = sys.argv[2:]
        rank_main(int(a[0]), int(a[1]), int(a[2]), int(a[3]), int(a[4]), a[5], int(a[6]), int(a[7]),
                  a[8] == "1")
    else:
        sys.exit(main())
