"""DistributedDataParallel over the ``pycoll`` torch backend: training that ends where gloo's does in
every DDP variant (tests/procs/torch/scripts/ddp.py), the priority hook's partitioning, credit and
order, and examples/ddp_train.py under the real torchrun."""

import re
import sys

import pytest

from tests.launch import TORCH_VARS, child_env, free_port

SCRIPT = "tests/procs/torch/scripts/ddp.py"


@pytest.mark.parametrize("n", [3])  # (2 ranks: test_ddp_matches_gloo_launchers and the examples)
def test_ddp_matches_gloo(n, torchrun):
    """MLP and CNN (BatchNorm) trained 20 steps in every variant: pycoll's parameters and buffers
    equal gloo's (bit for bit on 2 ranks), and the same on every rank."""
    torchrun(n, SCRIPT, "equal", launcher="env", timeout=90)


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_ddp_matches_gloo_launchers(launcher, torchrun):
    """The same under mpiexec (``import pycoll.torch`` fills in env://) and the real torchrun."""
    torchrun(2, SCRIPT, "equal", launcher=launcher, timeout=90)


@pytest.mark.usefixtures("no_agreement_check")  # counts the bytes of every part
@pytest.mark.parametrize(("n", "tls"), [(2, "tcp"), (3, "tcp"), (2, "shm,tcp")])
def test_priority_hook_partitions_and_orders(n, tls, torchrun):
    """Buckets split into parts of at most partition_bytes at priority -bucket.index(), started within
    the credit, most urgent bucket first once all are queued (over tcp, where parts hold credit; on
    the shared segment, parts and priorities only)."""
    torchrun(n, SCRIPT, "priority", launcher="env", timeout=60, env={"PYCOLL_TLS": tls})


@pytest.mark.parametrize("hook", [None, "--priority-hook", "--scheduled"],
                         ids=["default", "priority_hook", "scheduled"])
def test_example_under_torchrun(hook, run_cmd):
    """examples/ddp_train.py for a few steps on 2 ranks: exits 0, rank 0 prints the loss."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "examples/ddp_train.py", "--steps", "5", "--log-every", "2"]
    if hook:
        cmd.append(hook)
    rc, out, _ = run_cmd(cmd, timeout=60, env=child_env(drop=TORCH_VARS), merge=True,
                         what="examples/ddp_train.py")
    assert rc == 0, f"exit {rc}\n{out[-4000:]}"
    steps = re.findall(r"^step +(\d+) +loss (\d+\.\d+)$", out, re.MULTILINE)
    assert [s for s, _ in steps] == ["2", "4", "5"], f"expected rank 0's loss at steps 2, 4, 5\n{out[-4000:]}"
