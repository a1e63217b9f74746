"""pycoll.torch.ScheduledOptimizer: training without the global barrier ends where DDP's does, with
any optimizer, and the next forward overlaps the last layer's update
(tests/procs/torch/scripts/scheduled.py)."""

import json

import pytest

SCRIPT = "tests/procs/torch/scripts/scheduled.py"


@pytest.mark.parametrize("n", [3])  # (2 ranks: the scheduled example under torchrun)
def test_scheduled_optimizer_matches_ddp(n, torchrun):
    """SGD with momentum, AdamW (two groups), RMSprop and Adagrad on an MLP and a CNN, and an MLP
    with a head some ranks leave unused, 20 steps under 4 KiB partitions and 8 KiB credit: the
    parameters equal DDP's over gloo within 1e-6 relative and are the same on every rank."""
    torchrun(n, SCRIPT, "equal", launcher="env", timeout=120)


def test_forward_overlaps_last_update(tmp_path, torchrun):
    """A late last-layer gradient: step() returns at once, the next forward's layer 0 runs before
    the last layer's update finished, the last layer waits for it. Traced: every rank's file holds
    forward, backward and update spans."""
    path = tmp_path / "trace.json"
    torchrun(2, SCRIPT, "overlap", launcher="env", timeout=120, env={"PYCOLL_TRACE": str(path)})
    for rank in range(2):
        doc = json.loads((tmp_path / f"trace.rank{rank}.json").read_text())
        cats = {e.get("cat") for e in doc["traceEvents"]}
        assert {"forward", "backward", "update", "comm"} <= cats, f"rank {rank}: {sorted(map(str, cats))}"
