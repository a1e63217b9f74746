"""Training-like steps traced with PYCOLL_TRACE: step marks, forward and backward spans, and
tagged allreduces with priorities posted in a different order on each rank under a small credit
(some partitioned). The trace file is written at exit."""

import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import trace
from pycoll.team import Team
from tests.rank import run_rank


def main() -> None:
    ctx = pycoll.Context(credit_bytes=8192, partition_bytes=16384, timeout=60)
    team = Team.from_mpi(MPI.COMM_WORLD, ctx)
    tr = trace.tracer()
    assert tr is not None and tr.rank == team.rank, (tr, team.rank)
    sizes = [1024, 2048, 6000, 512]  # float32 elements: 6000 is split in parts
    for step in range(4):
        tr.step(step)
        with tr.span("forward", "forward"):
            time.sleep(0.002)
        reqs, bufs = [], []
        with tr.span("backward", "backward", step=step):
            order = range(len(sizes)) if team.rank == 0 else reversed(range(len(sizes)))
            for k in order:
                buf = np.full(sizes[k], float(team.rank + k), np.float32)
                bufs.append((k, buf))
                reqs.append(team.allreduce(buf, tag=f"grad{k}", priority=k))
                time.sleep(0.0005)
        t0 = time.monotonic()
        pycoll.wait_all(reqs)
        tr.complete("optimizer", "compute", t0, time.monotonic())
        for k, buf in bufs:
            assert buf[0] == sum(r + k for r in range(team.size)), (k, buf[0])
    tr.step(4)
    team.barrier().wait()


if __name__ == "__main__":
    run_rank(main)
