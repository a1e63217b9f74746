"""Run under mpiexec (2 ranks, PYCOLL_TLS=ucx, PYCOLL_TIMEOUT=2) by tests/procs/test_ucx.py: a
repeated v-collective over UCX runs its native program in the engine's express lane with right
results; counts changed in place make a new call; and a rank that repeats its call while its peer
changes the counts of its own is never given a wrong result: both ranks raise a pycoll error (the
peer's new call is checked, so it moves no data until the ranks agree)."""

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team
from pycoll.tl.ucx.executor import UCXProgramTask
from tests.rank import run_rank


def main():
    team = Team.from_mpi(MPI.COMM_WORLD)
    r, n = team.rank, team.size
    assert n == 2 and team.transport.name == "ucx", (n, team.transport)
    counts = [1, 2]
    send = np.full(counts[r], r + 1.0)
    recv = np.zeros(4)
    runs = []
    plain = UCXProgramTask.express_run
    UCXProgramTask.express_run = lambda task, number: runs.append(number) or plain(task, number)
    try:
        for k in range(40):
            send[:] = r + 1 + k
            team.allgatherv(send, recv, counts).wait()
            assert recv.tolist() == [1 + k, 2 + k, 2 + k, 0.0], (k, recv)
    finally:
        UCXProgramTask.express_run = plain
    assert len(runs) >= 20, runs  # (the first calls build it: in Python, then as a program)
    counts[0], counts[1] = 2, 1  # in place, on both ranks: a new call (rank 0 sends a new buffer)
    send2 = np.full(counts[r], r + 1.0)
    team.allgatherv(send2, recv, counts).wait()
    assert recv.tolist() == [1.0, 1.0, 2.0, 0.0], recv
    counts[0], counts[1] = 1, 2
    for _ in range(3):  # the first layout again, repeated
        team.allgatherv(send, recv, counts).wait()
    # rank 1 changes its counts while rank 0 repeats its call (the same keywords too: no timeout of
    # its own; PYCOLL_TIMEOUT is short), not at a number due the agreement check
    assert not team.planner.check_due("allgatherv", team.planner.posted(), again=True)
    if r == 1:
        mine, recv1, theirs = np.full(1, 9.0), np.zeros(4), [2, 1]
        call = lambda: team.allgatherv(mine, recv1, theirs).wait()  # noqa: E731
    else:
        recv[:] = -1
        call = lambda: team.allgatherv(send, recv, counts).wait()  # noqa: E731
    try:
        call()
    except pycoll.PycollError as exc:
        print(f"rank {r}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    else:
        raise AssertionError(f"rank {r}: the call returned ({recv})")


if __name__ == "__main__":
    run_rank(main)
