"""The mismatch campaign, short (benchmarks/mismatch.py --quick): ranks that disagree (count, dtype,
dtype of one size, op, root) through the Team API, pycoll.mpi.Comm and torch.distributed, on the
shared segment and over MPI: every rank raises the mismatch error in its front end's flavour,
no call returns."""

import sys

from tests.launch import ROOT, child_env


def test_mismatch_quick(run_cmd):
    cmd = [sys.executable, str(ROOT / "benchmarks/mismatch.py"), "--quick"]
    rc, out, err = run_cmd(cmd, timeout=300, env=child_env())
    assert rc == 0, out + err
    for transport in ("segment", "mpi"):
        for front in ("team", "comm", "torch"):
            assert f"{transport:<10} {front:<6}     5      5      0     0" in out, out
