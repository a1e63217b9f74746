"""DistributedDataParallel over the ``pycoll`` torch backend: training that ends where gloo's does in
every DDP variant (tests/torch/ddp.py), the priority hook's partitioning, credit and order, and
examples/ddp_train.py under the real torchrun."""

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.mpirun import ROOT
from tests.torchrun import free_port, run_torch

SCRIPT = "tests/torch/ddp.py"


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_matches_gloo(n):
    """MLP and CNN (BatchNorm) trained 20 steps in every variant: pycoll's parameters and buffers
    equal gloo's (bit for bit on 2 ranks), and the same on every rank."""
    run_torch(n, SCRIPT, "equal", launcher="env", timeout=90)


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_ddp_matches_gloo_launchers(launcher):
    """The same under mpiexec (``import pycoll.torch`` fills in env://) and the real torchrun."""
    run_torch(2, SCRIPT, "equal", launcher=launcher, timeout=90)


@pytest.mark.parametrize(("n", "tls"), [(2, "tcp"), (3, "tcp"), (2, "shm,tcp")])
def test_priority_hook_partitions_and_orders(n, tls):
    """Buckets split into parts of at most partition_bytes at priority -bucket.index(), started within
    the credit, most urgent bucket first once all are queued (over tcp, where parts hold credit; on
    the shared segment, parts and priorities only)."""
    run_torch(n, SCRIPT, "priority", launcher="env", timeout=60, env={"PYCOLL_TLS": tls})


@pytest.mark.parametrize("hook", [None, "--priority-hook", "--scheduled"],
                         ids=["default", "priority_hook", "scheduled"])
def test_example_under_torchrun(hook):
    """examples/ddp_train.py for a few steps on 2 ranks: exits 0, rank 0 prints the loss."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "examples/ddp_train.py", "--steps", "5", "--log-every", "2"]
    if hook:
        cmd.append(hook)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=str(ROOT), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"examples/ddp_train.py did not finish within 60 s\n{out[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-4000:]}"
    steps = re.findall(r"^step +(\d+) +loss (\d+\.\d+)$", out, re.MULTILINE)
    assert [s for s, _ in steps] == ["2", "4", "5"], f"expected rank 0's loss at steps 2, 4, 5\n{out[-4000:]}"
