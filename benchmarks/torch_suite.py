"""torch's own distributed tests with pycoll in place of gloo: how true a torch.distributed backend
pycoll is.

torch ships its distributed test suite inside the wheel
(``torch.testing._internal.distributed.distributed_test``, class ``DistributedTest._DistTestBase``;
upstream drives it from ``test/distributed/test_distributed_spawn.py``). This script runs it from
the installed wheel (nothing is copied into pycoll) with ``BACKEND=gloo``, so torch selects exactly
the tests it runs for gloo, once as it is (the control) and once with every process group that
asks for gloo made by pycoll instead. Ranks are forked from the test process (torch's own driver
spawns them: the same tests, minutes faster). A test passes only when it passes on every rank.

    python benchmarks/torch_suite.py                 # worlds 2, 3, 4 and 8
    python benchmarks/torch_suite.py -n 2 -k allreduce --json out.json

Needs ``expecttest`` (torch's test helpers import it): ``pip install expecttest``. Prints, per
world, the tests gloo passes, how many of them pass on pycoll, and each one that does not, with
the first line of its error. Tests that torch binds to gloo's name are listed apart
(:data:`BOUND_TO_GLOO`): they check the backend's name or refuse any other backend.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Dict, List

#: Tests that hold the backend to gloo's name, with why (not counted).
BOUND_TO_GLOO = {
    "test_get_backend": "asserts that dist.get_backend() is 'gloo'",
    **{f"test_monitored_barrier_{name}": "torch's monitored_barrier is refused for every backend but gloo"
       for name in ("gloo", "gloo_subgroup", "gloo_rank_0_timeout", "failure_order", "wait_all_ranks",
                    "allreduce_hang", "allreduce_hang_wait_all_ranks")},
}


def swap_gloo_for_pycoll() -> None:
    """Every process group torch makes for ``gloo`` is made by pycoll's backend instead (in this
    process and the ranks it forks)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import pycoll.torch  # noqa: F401 - registers the backend "pycoll"

    make = c10d._new_process_group_helper

    def made_by_pycoll(group_size, group_rank, global_ranks, backend, *args, **kwargs):
        if "gloo" in str(backend).lower():
            backend = dist.Backend(str(backend).lower().replace("gloo", "pycoll"))
        return make(group_size, group_rank, global_ranks, backend, *args, **kwargs)

    c10d._new_process_group_helper = made_by_pycoll


class Outcomes(unittest.TestResult):
    """Each test's outcome: ``{name: [status, first line of the reason]}``."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: Dict[str, List[str]] = {}
        self.started = 0.0

    @staticmethod
    def _name(test: unittest.TestCase) -> str:
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
        super().startTest(test)
        self.started = time.monotonic()

    def _say(self, test: unittest.TestCase, status: str, why: str = "") -> None:
        lines = [ln.strip() for ln in why.strip().splitlines() if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln or "Exception" in ln or "exited with" in ln]
        said = (errors or lines or [""])[-1]
        self.outcomes[self._name(test)] = [status, said[:300],
                                           f"{time.monotonic() - self.started:.1f}"]

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        self._say(test, "pass")

    def addFailure(self, test: unittest.TestCase, err) -> None:  # noqa: N802
        self._say(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test: unittest.TestCase, err) -> None:  # noqa: N802
        self._say(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        self._say(test, "skip", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err) -> None:  # noqa: N802
        self._say(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        self._say(test, "fail", "unexpected success")


def child(mode: str, world: int, pattern: str, out: str) -> None:
    """Run the suite in this process (its ranks forked from it) and write the outcomes to ``out``."""
    if mode == "pycoll":
        swap_gloo_for_pycoll()
    import torch.multiprocessing as tmp
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    class TestForked(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(tmp.get_context("fork").Process)

    loader = unittest.TestLoader()
    names = [n for n in loader.getTestCaseNames(TestForked) if pattern in n]
    suite = unittest.TestSuite(TestForked(n) for n in names)
    result = Outcomes()
    suite.run(result)
    with open(out, "w") as f:
        json.dump(result.outcomes, f)


def run(mode: str, world: int, pattern: str, timeout: float) -> Dict[str, List[str]]:
    """The outcomes of one world's run in ``mode`` (``gloo`` or ``pycoll``), in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="pycoll-torch-suite-") as tmpdir:
        out = os.path.join(tmpdir, "outcomes.json")
        env = dict(os.environ, BACKEND="gloo", WORLD_SIZE=str(world), TEMP_DIR=tmpdir,
                   DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(int(timeout)), OMP_NUM_THREADS="1",
                   PYTORCH_PRINT_REPRO_ON_FAILURE="0")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, str(world), pattern, out]
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
        if not os.path.exists(out):
            tail = "\n".join(proc.stdout.splitlines()[-20:])
            raise SystemExit(f"{mode} at {world} ranks: the suite did not finish (status {proc.returncode})\n"
                             f"{tail}")
        with open(out) as f:
            return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", default="2,3,4,8", help="world sizes (default 2,3,4,8)")
    ap.add_argument("-k", default="", help="only the tests whose name contains this")
    ap.add_argument("--timeout", type=float, default=60, help="one test's limit (s), as torch's")
    ap.add_argument("--json", help="write every test's outcome here")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        mode, world, pattern, out = args.child
        child(mode, int(world), pattern, out)
        return
    every: Dict[str, Dict[str, Dict[str, List[str]]]] = {}
    print(f"{'world':>5} {'gloo passes':>12} {'pycoll passes':>14} {'bound to gloo':>14}  time gloo / pycoll")
    for world in (int(w) for w in args.n.split(",")):
        t0 = time.monotonic()
        gloo = run("gloo", world, args.k, args.timeout)
        t1 = time.monotonic()
        ours = run("pycoll", world, args.k, args.timeout)
        t2 = time.monotonic()
        every[str(world)] = {"gloo": gloo, "pycoll": ours}
        passed = [t for t, o in gloo.items() if o[0] == "pass" and t not in BOUND_TO_GLOO]
        bound = [t for t, o in gloo.items() if o[0] == "pass" and t in BOUND_TO_GLOO]
        ok = [t for t in passed if ours.get(t, ["missing"])[0] == "pass"]
        share = len(ok) / max(1, len(passed))
        print(f"{world:>5} {len(passed):>12} {len(ok):>8} ({share:.0%}) {len(bound):>14}"
              f"  {t1 - t0:.0f} / {t2 - t1:.0f} s")
        for t in passed:
            if t not in ok:
                status, why = (ours.get(t) or ["missing", ""])[:2]
                print(f"      {t}: {status}: {why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(every, f, indent=1)


if __name__ == "__main__":
    main()
