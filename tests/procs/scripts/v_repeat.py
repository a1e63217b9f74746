"""Run under mpiexec (2 ranks, PYCOLL_TLS=ucx) by tests/procs/test_ucx.py: a repeated v-collective
over UCX runs as a native program (behind the agreement check, which every v-collective call takes)
with right results; counts changed in place make a new call; one rank repeating its call while the
other passes new arrays each time (the same call) still agree on the check; a rank that repeats
its call while its peer changes its counts, or rejects its call, raises MismatchError at once, as
does the peer. The repeated calls run the check in the native program, the others in Python: the
same messages."""

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
    for k in range(40):
        send[:] = r + 1 + k
        team.allgatherv(send, recv, counts).wait()
        assert recv.tolist() == [1 + k, 2 + k, 2 + k, 0.0], (k, recv)
    entry = team.recent.get(("allgatherv", id(send)))
    assert type(entry.persistent.task) is UCXProgramTask, entry.persistent.task
    # rank 0 repeats its call, rank 1 makes the same one on new arrays every time
    for k in range(20):
        out = recv if r == 0 else np.zeros(4)
        team.allgatherv(send if r == 0 else send.copy(), out, counts).wait()
        assert out.tolist() == [40.0, 41.0, 41.0, 0.0], (k, out)
    counts[0], counts[1] = 2, 1  # in place, on both ranks: a new call (rank 0 sends a new buffer)
    send2 = np.full(counts[r], r + 1.0)
    team.allgatherv(send2, recv, counts).wait()
    assert recv.tolist() == [1.0, 1.0, 2.0, 0.0], recv
    counts[0], counts[1] = 1, 2
    for _ in range(3):  # the first layout again, repeated
        team.allgatherv(send, recv, counts).wait()
    # rank 1 changes its counts while rank 0 repeats its call
    if r == 1:
        mine, recv1, theirs = np.full(1, 9.0), np.zeros(4), [2, 1]
        call = lambda: team.allgatherv(mine, recv1, theirs).wait()  # noqa: E731
    else:
        recv[:] = -1
        call = lambda: team.allgatherv(send, recv, counts).wait()  # noqa: E731
    try:
        call()
    except pycoll.MismatchError as exc:
        print(f"rank {r}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    else:
        raise AssertionError(f"rank {r}: the call returned ({recv})")
    # the team goes on; then rank 1 rejects its call (counts of the wrong length) while rank 0
    # repeats its own: both raise MismatchError at once, rank 0's naming the rejection
    for _ in range(3):
        team.allgatherv(send, recv, counts).wait()
    assert recv[:3].tolist() == [40.0, 41.0, 41.0], recv
    try:
        if r == 0:
            team.allgatherv(send, recv, counts).wait()
        else:  # (as pycoll.mpi.Comm does with a call that fails this rank's checks)
            try:
                team.allgatherv(send, recv, [1])
            except ValueError as error:
                raise team.planner.reject("allgatherv", error) from None
    except pycoll.MismatchError as exc:
        assert r == 1 or "rejected" in str(exc), exc
        print(f"rank {r}: rejection: {str(exc)[:160]}", flush=True)
    else:
        raise AssertionError(f"rank {r}: the rejected call returned")
    team.close()


if __name__ == "__main__":
    run_rank(main)
