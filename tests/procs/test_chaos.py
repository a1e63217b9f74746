"""The chaos campaign, short (benchmarks/chaos.py --trials 5 --shrink): a rank of four leaves in
each way (SIGKILL mid-collective, os._exit, an uncaught exception, sys.exit, closing its team),
once; the others raise within seconds, then revoke, shrink and compute on the three of them;
nothing hangs, no result is wrong, nothing is left behind. Over MPI's and UCX's point to point too
(``--tls``: a team made from MPI, which cannot shrink, and a store-made team over UCX)."""

import sys

import pytest

from tests.launch import ROOT, child_env, need_ucx


@pytest.mark.parametrize("tls", ["default", "tcp", "mpi", "ucx"])
def test_chaos_quick(tls, run_cmd):
    env = child_env({"PYCOLL_TLS": tls}) if tls in ("tcp",) else child_env(drop=("PYCOLL_TLS",))
    cmd = [sys.executable, str(ROOT / "benchmarks/chaos.py"), "--trials", "5", "--max-detection", "5",
           "--shrink", "--max-recovery", "10"]
    if tls in ("mpi", "ucx"):
        if tls == "ucx":
            need_ucx()
        cmd += ["--tls", tls]
    rc, out, err = run_cmd(cmd, timeout=300, env=env)
    assert rc == 0, out + err
    table = out.split("way ")[-1]
    for way in ("sigkill", "os_exit", "raise", "sys_exit", "close"):
        assert f"\n{way}" in table, out
    assert f"transports {tls}" in out or tls not in ("mpi", "ucx"), out
