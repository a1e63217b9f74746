"""push_pull through the torch backend: 2 ranks started torchrun-style, and ``pycoll run --servers 1``
with a torch script (tests/procs/torch/scripts/push_pull.py)."""

import sys

import pytest

from tests.launch import TORCH_VARS, child_env


def test_push_pull_in_torch(torchrun):
    pytest.importorskip("torch", reason="torch is not installed")
    torchrun(2, "tests/procs/torch/scripts/push_pull.py", timeout=90)


def test_push_pull_in_torch_with_servers(cli):
    """pycoll run -n 2 --servers 1 with a torch script: WORLD_SIZE counts the workers only, and
    pg.push_pull goes through the server."""
    pytest.importorskip("torch", reason="torch is not installed")
    env = child_env({"OMP_NUM_THREADS": "1"}, drop=TORCH_VARS)
    rc, out, err = cli("run", "-n", "2", "--servers", "1", "--timeout", "90", "--", sys.executable,
                       "tests/procs/torch/scripts/push_pull.py", env=env, timeout=120)
    out = out + err
    assert rc == 0 and "RANK 0 OK" in out and "RANK 1 OK" in out, out[-4000:]
