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


@pytest.mark.parametrize("launcher", ["mpiexec"])  # (torchrun: test_example_under_torchrun and the restart)
def test_ddp_matches_gloo_launchers(launcher, torchrun):
    """The same under mpiexec (``import pycoll.torch`` fills in env://)."""
    torchrun(2, SCRIPT, "equal", launcher=launcher, timeout=90)


@pytest.mark.usefixtures("no_agreement_check")  # counts the bytes of every part
@pytest.mark.parametrize(("n", "tls"), [(3, "tcp"), (2, "shm,tcp")])
def test_priority_hook_partitions_and_orders(n, tls, torchrun):
    """Buckets split into parts of at most partition_bytes at priority -bucket.index(), started within
    the credit, most urgent bucket first once all are queued (over tcp, where parts hold credit; on
    the shared segment, parts and priorities only)."""
    torchrun(n, SCRIPT, "priority", launcher="env", timeout=60, env={"PYCOLL_TLS": tls})


# (--priority-hook runs in the restart test below; --scheduled's optimizer in test_torch_scheduled.py)
@pytest.mark.parametrize("hook", [None], ids=["default"])
def test_example_under_torchrun(hook, run_cmd, tmp_path):
    """examples/ddp_train.py for a few steps on 2 ranks: exits 0, rank 0 prints the loss."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "examples/ddp_train.py", "--steps", "5", "--log-every", "2"]
    if hook:
        cmd.append(hook)
    rc, out, _ = run_cmd(cmd, timeout=60, env=child_env({"TMPDIR": str(tmp_path)}, drop=TORCH_VARS),
                         merge=True, what="examples/ddp_train.py")  # (TMPDIR: torchrun's own files)
    assert rc == 0, f"exit {rc}\n{out[-4000:]}"
    steps = re.findall(r"^step +(\d+) +loss (\d+\.\d+)$", out, re.MULTILINE)
    assert [s for s, _ in steps] == ["2", "4", "5"], f"expected rank 0's loss at steps 2, 4, 5\n{out[-4000:]}"


@pytest.mark.parametrize("tls", ["shm,tcp", "tcp"])
def test_a_peer_that_dies_fails_backward_not_the_process(tls, torchrun):
    """A rank gone between two steps: the other's backward raises RuntimeError naming it (gloo
    does the same); it used to die of SIGSEGV in DDP's reducer."""
    torchrun(2, SCRIPT, "peer_dies", launcher="env", timeout=60, env={"PYCOLL_TLS": tls})


def test_example_restarts_under_torchrun_from_its_checkpoint(tmp_path, run_cmd):
    """torchrun --max-restarts 1: rank 1 is SIGKILLed at step 7 of the first attempt; rank 0's
    collective fails at once (an error, not a crash: DDP's reducer gets a real C++ error from the
    work's future), torchrun restarts the job (pycoll's keys in torchrun's store are per attempt),
    and it resumes from the checkpoint of step 4 to the very parameters of an uninterrupted run."""
    def run(*extra: str) -> str:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=1",
               "--master-addr=127.0.0.1", f"--master-port={free_port()}", "examples/ddp_train.py",
               "--steps", "10", "--log-every", "5", "--priority-hook", *extra]
        scratch = tmp_path / "tmp"  # (TMPDIR: torchrun's own files, apart from the checkpoint)
        scratch.mkdir(exist_ok=True)
        rc, out, _ = run_cmd(cmd, timeout=120, env=child_env({"TMPDIR": str(scratch)}, drop=TORCH_VARS),
                             merge=True, what="examples/ddp_train.py " + " ".join(extra))
        assert rc == 0, f"exit {rc}\n{out[-4000:]}"
        return out

    plain = run()
    restarted = run("--checkpoint", str(tmp_path / "checkpoint"), "--checkpoint-every", "4", "--kill-at", "7")
    assert "rank 1: killed at step 7" in restarted and "resumed from the checkpoint of step 4" in restarted, \
        restarted[-4000:]
    assert "Segmentation fault" not in restarted and "exitcode: -11" not in restarted, restarted[-4000:]
    crc = re.findall(r"parameters crc32 (\w+)", plain)
    assert crc and re.findall(r"parameters crc32 (\w+)", restarted) == crc, (plain[-2000:], restarted[-4000:])
