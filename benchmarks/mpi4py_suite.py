"""mpi4py's own collective tests with ``pycoll.mpi.Comm`` swapped in: how true a drop-in it is.

Fetches the source distribution of the installed mpi4py at run time (``pip download``; never
vendored) and runs its collective test files (``test/test_cco_*.py``) under mpiexec at each rank
count twice: as plain mpi4py (the control), and with every intracommunicator a test uses wrapped
in ``pycoll.mpi.Comm`` (class attributes such as ``COMM = MPI.COMM_WORLD`` and what ``setUp``
makes). A test passes only when it passes on every rank. For each test it also records whether
pycoll's engine started anything while it ran (``Context.posted`` moved): tests that pass without
it were handed to mpi4py by the Comm (object collectives, neighbor collectives, ...).

Per file and rank count it prints: tests, passed by mpi4py (the control), passed with pycoll,
of those through pycoll's engine, failed, errors, and "lost" (no report: the job hung past
``--timeout`` or crashed). The intercommunicator files (``*_inter``) make their intercommunicators
from the wrapped ones (``Create_intercomm`` of a Comm: a ``pycoll.mpi_inter.InterComm``, whose
collectives are MPI's; its ``Merge`` is a Comm again).

    python benchmarks/mpi4py_suite.py                      # 2, 3 and 4 ranks; every cco file
    python benchmarks/mpi4py_suite.py -n 2 --files buf,vec --json out.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any, Dict, List, Optional

FILES = ("buf", "nb_buf", "pr_buf", "vec", "nb_vec", "pr_vec", "obj", "ngh_buf", "pr_ngh_buf", "ngh_obj",
         "buf_inter", "vec_inter", "obj_inter")


# ------------------------------------------------------------------ one rank
def rank_main(testdir: str, name: str, out: str, wrap: bool) -> None:
    """Run one test file on this rank; write {test id: [outcome, engine used]} to out.<rank>.json."""
    import unittest

    from mpi4py import MPI

    sys.path.insert(0, testdir)
    import pycoll
    from pycoll.mpi import Comm

    module = __import__(f"test_cco_{name}")
    ctx = pycoll.get_context()
    wrapped: Dict[int, Any] = {}

    def swap(comm: Any) -> Any:
        if not wrap or isinstance(comm, Comm) or not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            return comm
        if comm in (MPI.COMM_WORLD, MPI.COMM_SELF):  # (one wrapper each for the whole file)
            key = 0 if comm == MPI.COMM_WORLD else 1
            if key not in wrapped:
                wrapped[key] = Comm(comm)
            return wrapped[key]
        return Comm(comm)

    for cls in list(vars(module).values()):
        if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
            continue
        if isinstance(getattr(cls, "COMM", None), MPI.Comm):
            cls.COMM = swap(cls.COMM)
        set_up = cls.setUp

        def setUp(self: Any, set_up: Any = set_up) -> None:  # noqa: N802 - unittest's name
            set_up(self)
            if isinstance(getattr(self, "COMM", None), MPI.Comm):
                self.COMM = swap(self.COMM)

        cls.setUp = setUp

    results: Dict[str, List[Any]] = {}

    class Result(unittest.TestResult):
        def startTest(self, test: Any) -> None:  # noqa: N802
            super().startTest(test)
            self.before = ctx.posted
            results[test.id()] = ["pass", False]

        def stopTest(self, test: Any) -> None:  # noqa: N802
            results[test.id()][1] = ctx.posted != self.before
            super().stopTest(test)

        def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
            results[test.id()][0] = "fail"

        def addError(self, test: Any, err: Any) -> None:  # noqa: N802
            results[test.id()][0] = "error"
            results[test.id()].append(str(err[1])[:200])

        def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
            results[test.id()][0] = "skip"

    unittest.defaultTestLoader.loadTestsFromModule(module).run(Result())
    with open(f"{out}.{MPI.COMM_WORLD.Get_rank()}.json", "w") as f:
        json.dump(results, f)


# ------------------------------------------------------------------ the campaign
def fetch(workdir: str) -> str:
    """The test directory of the installed mpi4py's source distribution (downloaded here)."""
    import mpi4py

    version = mpi4py.__version__
    # (no build isolation: pip would build Cython from source, minutes, only to read the metadata)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "--no-build-isolation", f"mpi4py=={version}", "-d", workdir], check=True,
                   stderr=subprocess.DEVNULL)
    (sdist,) = glob.glob(os.path.join(workdir, f"mpi4py-{version}.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(workdir, filter="data")
    return os.path.join(workdir, f"mpi4py-{version}", "test")


def run_job(args: List[str], n: int, job: str, timeout: float, env: Dict[str, str]) -> bytes:
    """Run ``python <args>`` on ``n`` ranks under mpiexec as job ``job`` (its processes marked
    with it: mpiexec gives each rank a session of its own), ended with its ranks after
    ``timeout`` seconds, MPICH's files of the job removed; its standard error."""
    from pycoll.launch import JOB_VAR, end_job, find_mpiexec
    from pycoll.leftovers import JobFiles

    cmd = [find_mpiexec(), "-n", str(n), sys.executable, *args]
    files = JobFiles(JOB_VAR, job)
    started = time.time()
    proc = subprocess.Popen(cmd, env=dict(env, **{JOB_VAR: job}), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    files.launcher(proc.pid, started)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a hung job: end it, its ranks too
        end_job(proc, job, files)
        err = b"(timed out)"
    files.remove()  # what MPICH left (a hung or aborted job's): the job's own only
    return err


def run_file(testdir: str, name: str, n: int, wrap: bool, timeout: float) -> Optional[Dict[str, List[Any]]]:
    """{test: [outcome on every rank ("pass" only if all passed), engine used on any rank]}, or
    None if some rank wrote no report (hung or crashed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r")
        env = dict(os.environ, PYCOLL_TIMEOUT="20", PYCOLL_ABORT_ON_ERROR="0", PYTHONPATH=testdir)
        run_job([os.path.abspath(__file__), "--rank", testdir, name, out, "1" if wrap else "0"], n,
                f"{os.getpid()}.{name}.{n}", timeout, env)
        ranks = []
        for r in range(n):
            try:
                with open(f"{out}.{r}.json") as f:
                    ranks.append(json.load(f))
            except (OSError, ValueError):
                return None
    merged: Dict[str, List[Any]] = {}
    for test in ranks[0]:
        outcomes = [rep.get(test, ["lost", False]) for rep in ranks]
        kinds = {o[0] for o in outcomes}
        verdict = "pass" if kinds == {"pass"} else "skip" if kinds == {"skip"} else \
            "error" if "error" in kinds else "fail"
        merged[test] = [verdict, any(o[1] for o in outcomes)]
    return merged


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", default="2,3,4", help="rank counts (default 2,3,4)")
    ap.add_argument("--files", default=",".join(FILES), help="test_cco_<name>.py files (default: all)")
    ap.add_argument("--timeout", type=float, default=600, help="wall-clock limit of one file's job (s)")
    ap.add_argument("--json", help="write every test's outcome here")
    ap.add_argument("--rank", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        testdir, name, out, wrap = args.rank
        rank_main(testdir, name, out, wrap == "1")
        return 0
    sizes = [int(x) for x in args.n.split(",")]
    files = [f for f in args.files.split(",") if f]
    everything: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        testdir = fetch(work)
        print(f"{'file':<12} {'ranks':>5} {'tests':>5} {'mpi4py':>6} {'pycoll':>6} {'engine':>6} {'fail':>5} "
              f"{'error':>5} {'lost':>5}  seconds", flush=True)
        total = {"control": 0, "both": 0, "engine": 0}
        for n in sizes:
            for name in files:
                t0 = time.monotonic()
                control = run_file(testdir, name, n, False, args.timeout)
                mine = run_file(testdir, name, n, True, args.timeout)
                everything[f"{name}@{n}"] = {"mpi4py": control, "pycoll": mine}
                passed = {t for t, (v, _) in (control or {}).items() if v == "pass"}
                tests = len(control or {})
                if mine is None:
                    print(f"{name:<12} {n:>5} {tests:>5} {len(passed):>6} {'-':>6} {'-':>6} {'-':>5} "
                          f"{'-':>5} {len(passed):>5}  {time.monotonic() - t0:.0f}", flush=True)
                    total["control"] += len(passed)
                    continue
                ok = {t for t in passed if mine.get(t, ["lost"])[0] == "pass"}
                engine = {t for t in ok if mine[t][1]}
                fail = sum(1 for t in passed if mine.get(t, ["lost"])[0] == "fail")
                error = sum(1 for t in passed if mine.get(t, ["lost"])[0] == "error")
                lost = sum(1 for t in passed if t not in mine)
                total["control"] += len(passed)
                total["both"] += len(ok)
                total["engine"] += len(engine)
                print(f"{name:<12} {n:>5} {tests:>5} {len(passed):>6} {len(ok):>6} {len(engine):>6} "
                      f"{fail:>5} {error:>5} {lost:>5}  {time.monotonic() - t0:.0f}", flush=True)
    c = total["control"] or 1
    print(f"\npassed with pycoll: {total['both']} of the {total['control']} tests mpi4py passes "
          f"({100 * total['both'] / c:.0f}%); through pycoll's engine: {total['engine']} "
          f"({100 * total['engine'] / c:.0f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
