"""The ``pycoll`` torch.distributed backend against gloo: every collective, op and dtype, in real
processes started torchrun-style (env:// and its store) and by mpiexec."""

import pytest


@pytest.mark.parametrize("n", [3])  # (2 ranks: test_collectives_mpiexec)
def test_collectives_env(n, torchrun):
    torchrun(n, "tests/procs/torch/scripts/collectives.py", "all", launcher="env", timeout=120)


@pytest.mark.parametrize("n", [2])  # (3 ranks run under env:// above: only the launcher differs)
def test_collectives_mpiexec(n, torchrun):
    torchrun(n, "tests/procs/torch/scripts/collectives.py", "all", launcher="mpiexec", timeout=120)


@pytest.mark.parametrize("n", [2, 3])
def test_vanished_peer_fails_fast(n, torchrun):
    """A rank that dies makes the others' collectives raise a pycoll error, not hang."""
    torchrun(n, "tests/procs/torch/scripts/collectives.py", "vanish", launcher="env", timeout=60)


def test_ranks_that_disagree_raise_dist_backend_errors(torchrun):
    """all_reduce with one element more on the last rank: DistBackendError (pycoll's
    MismatchError) on every rank, never a result."""
    torchrun(3, "tests/procs/torch/scripts/collectives.py", "mismatch", launcher="env", timeout=60)


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp2_dtensor_and_checkpoint_match_gloo(n, torchrun):
    """FSDP2 (fully_shard) training, DTensor on a CPU DeviceMesh and torch.distributed.checkpoint
    save/load on pycoll give gloo's losses and parameters (bit for bit on 2 ranks, within float32
    rounding on 4, where the reduction orders differ)."""
    torchrun(n, "tests/procs/torch/scripts/fsdp_dtensor.py", launcher="env", timeout=180)


def test_backend_by_name_without_importing_pycoll_torch():
    """``import torch`` registers the "pycoll" backend by name (torch's backend autoload, the
    ``torch.backends`` entry point of the installed package): init_process_group("pycoll") works
    without ``import pycoll.torch``, which the backend's creator imports on first use."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    code = """
import sys
import torch
import torch.distributed as dist
assert "pycoll" in dist.Backend.backend_list and "pycoll.torch" not in sys.modules
dist.init_process_group("pycoll", rank=0, world_size=1, store=dist.HashStore())
t = torch.arange(4.0)
dist.all_reduce(t)
assert dist.get_backend() == "pycoll" and "pycoll.torch" in sys.modules and t.tolist() == [0, 1, 2, 3]
dist.destroy_process_group()
print("BY NAME OK")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "BY NAME OK" in out.stdout, out.stderr[-2000:]
