"""push_pull through the torch backend (workers only: colocated summation services)."""

import os

import torch
import torch.distributed as dist

import pycoll.torch  # noqa: F401 - registers the backend
from tests.rank import run_torch_rank


def main() -> None:
    dist.init_process_group("pycoll")
    pg = dist.distributed_c10d._get_default_group()
    n, r = dist.get_world_size(), dist.get_rank()
    servers = int(os.environ.get("PYCOLL_NUM_SERVERS", "0") or 0)
    if servers:
        assert pg.ps_team is not None and pg.ps_team.servers == list(range(n, n + servers)), pg.ps_team
    else:
        assert pg.ps_team is None
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = torch.arange(100_003, dtype=torch.float32).to(dtype) + r
        pg.push_pull(t, name=f"g{dtype}").wait()
        want = (torch.arange(100_003, dtype=torch.float64) * n + n * (n - 1) / 2).to(dtype)
        torch.testing.assert_close(t, want, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=0)
    m = torch.full((5, 7), float(r))
    pg.push_pull(m, name="mean", average=True).wait()
    assert torch.allclose(m, torch.full((5, 7), (n - 1) / 2)), m
    dist.destroy_process_group()


if __name__ == "__main__":
    run_torch_rank(main)
