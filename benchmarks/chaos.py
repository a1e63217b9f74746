"""Chaos campaign: kill one rank at a random moment and measure how fast the others know.

Each trial starts ``-n`` ranks on this host, makes a team of them, runs a random sequence of
collectives checked against numpy, and makes one random rank leave at a random call in one of
these ways:

- ``sigkill``: SIGKILL in the middle of a collective (posted, partly done);
- ``os_exit``: ``os._exit(3)`` between calls (no atexit, no exception: the process is gone);
- ``raise``: an uncaught exception between calls;
- ``sys_exit``: ``sys.exit(0)`` between calls (the interpreter exits normally);
- ``close``: the rank closes its team and lives on (sleeps; killed at the end of the trial).

The team, by ``--tls`` (a list; each gets its own trials and table):

- ``segment``: from a TCP store (``Team.from_store``), on the host's shared segment;
- ``tcp``, ``ucx``: from a TCP store, point to point over pycoll's TCP or UCX (``PYCOLL_TLS``);
- ``mpi``: from MPI (``Team.from_mpi`` of ``COMM_WORLD``), point to point over MPI. Its ranks start
  under ``mpiexec -disable-auto-cleanup``, each under a shell it leaves for a process group of its
  own, with ``PYCOLL_ABORT_ON_ERROR=0``: MPICH's launcher would otherwise end the whole job when a
  rank dies or raises, leaving nobody to measure. The survivors cannot finalize MPI with a peer
  gone: the trial ends them once they reported, and removes the files MPICH then leaves (counted
  apart, not as leftovers). No ``--shrink`` there: a shrink needs a store-made team.

Without ``--tls``: one campaign of store-made teams on what ``PYCOLL_TLS`` names (the default: the
segment).

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
    python benchmarks/chaos.py --tls mpi,ucx     # MPI's and UCX's point to point, one table each
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
import tempfile
import time
from typing import Any, Dict, List

WAYS = ("sigkill", "os_exit", "raise", "sys_exit", "close")
#: marks a trial's processes in their environment (pycoll.leftovers.JobFiles)
TRIAL_VAR = "PYCOLL_CHAOS_TRIAL"
COLLS = ("allreduce", "bcast", "allgather", "alltoall", "gather", "scatter", "reduce", "barrier")
#: The settings of each team kind (``--tls``); ``mpi``'s team is made from MPI, the others' from a store.
TRANSPORTS = {"segment": {"PYCOLL_TLS": "shm,tcp"}, "tcp": {"PYCOLL_TLS": "tcp"},
              "ucx": {"PYCOLL_TLS": "ucx"}, "mpi": {"PYCOLL_TLS": "mpi", "PYCOLL_ABORT_ON_ERROR": "0"}}
_report: Any = None  # where this rank writes what happened to it (one JSON object a line)


def say(**what: Any) -> None:
    """Write one record of what happened to this rank to its report file."""
    _report.write(json.dumps(what) + "\n")
    _report.flush()


# ------------------------------------------------------------------ one rank
def rank_main(kind: str, out: str, rank: int, size: int, port: int, seed: int, victim: int, way: str,
              die_at: int, calls: int, shrink: bool = False) -> None:
    """One rank of a trial: ``kind`` ``store`` (a store-made team around the store at ``port``) or
    ``mpi`` (a team made from MPI's world: ``rank`` and ``size`` are its own); it writes what
    happens to it to ``out/<rank>.jsonl``."""
    global _report
    import numpy as np

    import pycoll
    from pycoll import Team

    if kind == "mpi":
        os.setpgid(0, 0)  # (out of the process group the launcher ends when a rank dies: see above)
        from mpi4py import MPI

        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        _report = open(os.path.join(out, f"{rank}.jsonl"), "a")  # noqa: SIM115 - this rank's, to its end
        team = Team.from_mpi(MPI.COMM_WORLD)
    else:
        from pycoll.store import TCPStore

        _report = open(os.path.join(out, f"{rank}.jsonl"), "a")  # noqa: SIM115 - this rank's, to its end
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
                say(rank=rank, left=time.time())
                os.kill(os.getpid(), signal.SIGKILL)
            result = post(team, coll, x, count, root, size).wait()
            if not check(coll, result, count, root, rank, size, np):
                say(rank=rank, wrong=f"{coll} #{i}")
                return
        except pycoll.PycollError as exc:
            say(rank=rank, error=time.time(), kind=type(exc).__name__, call=i, since_call=time.time() - t0,
                text=str(exc)[:300])
            if shrink:
                go_on(team, rank, size, victim)
            return
    say(rank=rank, finished=True)


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
        say(rank=rank, recovered=time.time(), members=new.size, ok=bool(ok))
        new.close()
    except pycoll.PycollError as exc:
        say(rank=rank, unrecovered=f"{type(exc).__name__}: {exc}"[:300])


def leave(team: Any, way: str) -> None:
    """Leave the team in ``way`` (between calls), having said when."""
    say(rank=team.rank, left=time.time())
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
def trial(size: int, seed: int, way: str, limit: float, timeout: float, shrink: bool = False,
          tl: str = "") -> Dict:
    """One trial on the team kind ``tl`` (see ``TRANSPORTS``; "": a store-made team on what the
    environment says): the ranks' reports, and what went wrong."""
    from pycoll.launch import find_mpiexec
    from pycoll.leftovers import JobFiles
    from pycoll.store import TCPStore

    rng = random.Random(seed)
    victim, calls = rng.randrange(size), 12
    die_at = rng.randrange(2, calls - 2)
    mark = f"{os.getpid()}.{seed}.{tl}"  # (its processes carry it: their files are counted, no others)
    files = JobFiles(TRIAL_VAR, mark).watch()
    env = dict(os.environ, PYCOLL_TIMEOUT=str(timeout), **TRANSPORTS.get(tl, {}), **{TRIAL_VAR: mark})
    out = tempfile.mkdtemp(prefix="pycoll-chaos-")
    argv = [str(seed), str(victim), way, str(die_at), str(calls), str(int(shrink))]
    server = None
    if tl == "mpi":
        cmd = [find_mpiexec(), "-disable-auto-cleanup", "-n", str(size), "sh", "-c", '"$@"; exit $?', "sh",
               sys.executable, __file__, "--rank", "mpi", out, "-1", str(size), "0", *argv]
        started = time.time()
        procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                  start_new_session=True)]
        files.launcher(procs[0].pid, started)
    else:
        server = TCPStore(port=0, is_master=True, timeout=30)
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", "store", out, str(r), str(size),
                                   str(server.port), *argv], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env=env, start_new_session=True)
                 for r in range(size)]
    survivors = [r for r in range(size) if r != victim]
    deadline = time.monotonic() + limit
    while True:  # until every survivor is done (or the limit): the victim may live on (close, MPI_Finalize)
        reports = _reports(out, size)
        if all(_done(reports.get(r, {}), shrink) for r in survivors) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.1)
    hung = [r for r in survivors if not _done(reports.get(r, {}), shrink)]
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _end_marked(mark)
    for p in procs:
        p.wait()
    if server is not None:
        server.close()
    reports = _reports(out, size)
    for f in os.listdir(out):
        os.unlink(os.path.join(out, f))
    os.rmdir(out)
    left = reports.get(victim, {}).get("left")
    detections, wrong, timeouts, recoveries, unrecovered = [], [], [], [], []
    for r in survivors:
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
    present = files.present()
    files.remove()
    # (a team from MPI: the trial ended its ranks, so MPICH's files are the trial's doing, not left)
    leftovers = [f for f in present if tl != "mpi" or os.path.basename(f).startswith("pycoll")]
    return {"tl": tl, "way": way, "victim": victim, "die_at": die_at, "detections": detections, "hung": hung,
            "recoveries": recoveries, "unrecovered": unrecovered, "timeouts": timeouts, "wrong": wrong,
            "leftovers": leftovers, "removed": len(present) - len(leftovers),
            "texts": sorted({reports.get(r, {}).get("text", "")[:120] for r in survivors})}


def _reports(out: str, size: int) -> Dict[int, Dict]:
    """What each rank wrote so far (its records merged, later ones win)."""
    reports: Dict[int, Dict] = {}
    for r in range(size):
        try:
            with open(os.path.join(out, f"{r}.jsonl")) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                reports.setdefault(r, {}).update(json.loads(line))
            except json.JSONDecodeError:  # (a line being written)
                pass
    return reports


def _done(rep: Dict, shrink: bool) -> bool:
    """Whether a survivor wrote all it will: a wrong result, the end, or its error (and, with
    ``--shrink``, whether it went on)."""
    if "wrong" in rep or "finished" in rep:
        return True
    return "error" in rep and (not shrink or "recovered" in rep or "unrecovered" in rep)


def _end_marked(mark: str) -> None:
    """SIGKILL every process that carries the trial's mark (a rank of a team from MPI leaves the
    launcher's process group), and wait until they are gone."""
    tag = f"{TRIAL_VAR}={mark}\0".encode()
    for _ in range(100):
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if tag in f.read():
                        pids.append(int(pid))
            except OSError:
                continue
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)


def campaign(tl: str, args: argparse.Namespace, trials: int) -> int:
    """The trials on team kind ``tl`` and their table; how many of them went wrong."""
    shrink = args.shrink and tl != "mpi"
    results: List[Dict] = []
    for t in range(trials):
        way = WAYS[t % len(WAYS)]
        res = trial(args.n, args.seed * 1000 + t, way, limit=args.timeout + 30, timeout=args.timeout,
                    shrink=shrink, tl=tl)
        results.append(res)
        print(f"trial {t:3d} {way:<8} victim {res['victim']} at call {res['die_at']}: detected in "
              + (", ".join(f"{d:.3f}" for d in res["detections"]) or "-") + " s"
              + ("; went on in " + (", ".join(f"{d:.3f}" for d in res["recoveries"]) or "-") + " s"
                 if shrink else "")
              + "".join(f"; {k} {res[k]}" for k in ("hung", "timeouts", "wrong", "leftovers", "unrecovered")
                        if res[k]),
              flush=True)
    what = tl or f"store teams, PYCOLL_TLS {os.environ.get('PYCOLL_TLS', 'default')}"
    note = "" if shrink or not args.shrink else " (no --shrink: it needs a store-made team)"
    print(f"\n{args.n} ranks, {trials} trials, transports {what}{note}")
    print(f"{'way':<9} {'trials':>6} {'median_s':>9} {'max_s':>7} {'hangs':>6} {'timeouts':>8} {'wrong':>6} "
          f"{'leftovers':>9}" + (f" {'went_on_median_s':>16} {'went_on_max_s':>13} {'not_on':>6}"
                                 if shrink else ""))
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
        if shrink:
            rec = [d for r in rs for d in r["recoveries"]]
            stuck = sum(len(r["unrecovered"]) for r in rs)
            bad += stuck + sum(d > args.max_recovery for d in rec)
            line += (f" {statistics.median(rec) if rec else float('nan'):>16.3f} "
                     f"{max(rec) if rec else float('nan'):>13.3f} {stuck:>6}")
        print(line)
    ds = [d for r in results for d in r["detections"]]
    if ds:
        print(f"{'all':<9} {len(results):>6} {statistics.median(ds):>9.3f} {max(ds):>7.3f}")
    if tl == "mpi":
        print(f"(MPICH's files of the ended jobs, removed: {sum(r['removed'] for r in results)})")
    if args.json:
        with open(args.json, "a") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=4, help="ranks per trial (default 4)")
    ap.add_argument("--trials", type=int, default=100, help="trials per transport")
    ap.add_argument("--quick", action="store_true", help="10 trials, two of each way")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=20.0, help="PYCOLL_TIMEOUT of the ranks")
    ap.add_argument("--tls", default="",
                    help=f"team kinds, each a campaign of its own ({', '.join(TRANSPORTS)}); default: "
                         "store-made teams on what PYCOLL_TLS says")
    ap.add_argument("--shrink", action="store_true",
                    help="the survivors revoke, shrink and check an allreduce on the new team "
                         "(store-made teams)")
    ap.add_argument("--json", help="append every trial here")
    ap.add_argument("--max-detection", type=float, default=1.0,
                    help="a detection slower than this (seconds) fails the campaign (default 1)")
    ap.add_argument("--max-recovery", type=float, default=2.0,
                    help="with --shrink: going on later than this (seconds) fails the campaign (default 2)")
    args = ap.parse_args()
    kinds = [t for t in args.tls.split(",") if t] or [""]
    unknown = [t for t in kinds if t and t not in TRANSPORTS]
    if unknown:
        ap.error(f"unknown --tls {unknown}: choose among {', '.join(TRANSPORTS)}")
    trials = 10 if args.quick else args.trials
    bad = sum(campaign(tl, args, trials) for tl in kinds)
    if bad:
        print(f"FAILED: {bad} hangs, wrong results, leftovers, detections over {args.max_detection:g} s"
              + (f" or survivors that did not go on within {args.max_recovery:g} s" if args.shrink else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        a = sys.argv[2:]
        rank_main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), int(a[6]), a[7], int(a[8]),
                  int(a[9]), a[10] == "1")
    else:
        sys.exit(main())
