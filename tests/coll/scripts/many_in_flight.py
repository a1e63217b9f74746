"""1,000 mixed collectives in flight on one team of real processes, under a small credit.

``tagged``: every rank posts them in its own random order (matched by tag);
``untagged``: same order on every rank (matched by posting order, as MPI), random priorities.
"""

import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll.team import Team
from tests.rank import run_rank
from tests.reference import check_mixed, mixed_plan, post_mixed


def main(mode: str, total: str, credit: str) -> None:
    ctx = pycoll.Context(credit_bytes=int(credit), partition_bytes=0, timeout=120)
    team = Team.from_mpi(MPI.COMM_WORLD, ctx)
    work = mixed_plan(int(total))
    order = np.random.default_rng(team.rank).permutation(len(work)) if mode == "tagged" else range(len(work))
    bufs = {}
    reqs = [post_mixed(team, work[k][0], int(k), work[k][1], bufs, tagged=mode == "tagged") for k in order]
    pycoll.wait_all(reqs)
    for k, (kind, count) in enumerate(work):
        check_mixed(team, kind, k, count, bufs[k])
    if int(credit) and (mode == "tagged" or team.shared is None):
        # (untagged on a shared segment: every collective runs there, and those take no credit)
        assert ctx.stats["credit_waits"] > 0, ctx.stats
    print(f"rank {team.rank}: {ctx.stats}", flush=True)


if __name__ == "__main__":
    run_rank(main, *sys.argv[1:])
