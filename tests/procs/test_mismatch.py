"""The mismatch campaign, short (benchmarks/mismatch.py --quick): ranks that disagree (count, dtype
of one size, op, bcast root and count, scan op, allgatherv counts) at calls 1, 9 and 50 of a team
(Team API; pycoll.mpi.Comm and torch.distributed at call 9), on the shared segment and over MPI:
every rank raises the mismatch error in its front end's flavour, at the call or (a rank whose part
told it nothing, a bcast's root) at its next call; no case is silent."""

import re
import sys

from tests.launch import ROOT, child_env


def test_mismatch_quick(run_cmd):
    cmd = [sys.executable, str(ROOT / "benchmarks/mismatch.py"), "--quick"]
    rc, out, err = run_cmd(cmd, timeout=420, env=child_env())
    assert rc == 0, out + err
    cases = {"team": 21, "comm": 7, "torch": 5}  # (torch: no scan, no allgatherv)
    for transport in ("segment", "mpi"):
        for front, n in cases.items():
            row = re.search(rf"^{transport}\s+{front}" + r"\s+(\d+)" * 7 + "$", out, re.M)
            assert row is not None, out
            total, raised, learned_next, _, late, silent, other = map(int, row.groups())
            assert (total, late, silent, other) == (n, 0, 0, 0) and raised + learned_next == n, out
