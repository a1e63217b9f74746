"""The soak campaign, short (benchmarks/soak.py --quick): 400 random collectives (kind, size up to
256 KiB, dtype, op, root, tagged or not, persistent or not) on 4 ranks, each checked against
numpy, on the shared segment and on MPI's point to point; none wrong, files and threads flat."""

import sys

import pytest

from tests.launch import ROOT, child_env, mpiexec


@pytest.mark.parametrize("tls", ["shm,mpi", "mpi"])
def test_soak_quick(tls, run_cmd):
    cmd = [mpiexec(), "-n", "4", sys.executable, str(ROOT / "benchmarks/soak.py"), "--quick"]
    rc, out, err = run_cmd(cmd, timeout=180, env=child_env({"PYCOLL_TLS": tls}))
    assert rc == 0 and "wrong: 0" in out and "400 collectives on 4 ranks" in out, out + err
