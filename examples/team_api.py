"""pycoll's own API, the Team: one tour of what a program does with it.

A team is a group of ranks with a progress engine. Every collective call is non-blocking: it
returns a Request at once, and ``wait()`` returns the output (or re-raises the collective's error).
This program makes a team from MPI's world, then shows a blocking allreduce, one overlapped with
work, a persistent allreduce started in a loop, tags and priorities, a v-collective and the errors
a program can catch. Every result is checked against numpy; rank 0 prints what it did.

    mpiexec -n 2 python examples/team_api.py      # any number of ranks
"""

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import ReduceOp, Team

team = Team.from_mpi(MPI.COMM_WORLD)  # or Team.from_store(store, rank, size), pycoll.local_teams(n)
rank, size = team.rank, team.size
ranks = np.arange(size)
log = []

# 1. Blocking: post, then wait at once. recvbuf=None (the default) reduces in place.
x = np.full(4, rank + 1.0, dtype=np.float32)
team.allreduce(x, op=ReduceOp.SUM).wait()
assert np.all(x == sum(ranks + 1))
log.append("blocking allreduce")

# 2. Non-blocking: the request runs while this rank computes; test() drives the engine a little.
grad = np.full(1 << 16, float(rank), dtype=np.float64)
out = np.empty_like(grad)
req = team.allreduce(grad, out)  # out of place: grad is left as it was
work = 0
while not req.test():  # stands for the next layer's backward pass, a data loader, ...
    work += 1
result = req.wait()  # the output buffer
assert result is out and np.all(out == sum(ranks)) and np.all(grad == rank)
log.append("overlapped allreduce")

# 3. Persistent (MPI-4 style): checked and built once, started as often as needed.
buf = np.empty(256, dtype=np.float32)
step = team.allreduce_init(buf, op=ReduceOp.MAX)
for i in range(5):
    buf[:] = rank * 10 + i  # refill the same array between starts
    step.start().wait()
    assert np.all(buf == (size - 1) * 10 + i)
step.free()
log.append("persistent allreduce x5")

# 4. Tags and priorities. Untagged collectives match across ranks by posting order (the MPI rule);
#    tagged ones match by tag, so ranks may post them in different orders. priority: lower starts
#    first when several collectives wait for the engine (see examples/scheduling_trace.py).
a, b = np.full(100, rank, dtype=np.int64), np.full(10, 2 * rank, dtype=np.int64)
posts = [("weights", a, 1), ("bias", b, 0)]
if rank % 2:
    posts.reverse()  # odd ranks post in the other order
reqs = [team.allreduce(arr, tag=name, priority=prio) for name, arr, prio in posts]
pycoll.wait_all(reqs)
assert np.all(a == sum(ranks)) and np.all(b == 2 * sum(ranks))
log.append("tagged allreduces in different orders")

# 5. A v-collective: rank r contributes r + 1 elements; every rank gets them all, back to back.
counts = list(ranks + 1)
mine = np.full(rank + 1, rank, dtype=np.int32)
gathered = np.empty(sum(counts), dtype=np.int32)
team.allgatherv(mine, gathered, counts=counts).wait()
assert np.array_equal(gathered, np.repeat(ranks, counts))
log.append("allgatherv")

# 6. Errors. A bad argument raises on the calling rank before anything is sent, so no peer waits
#    (here every rank makes the same mistakes) and the team goes on. Argument errors are
#    ValueErrors; a buffer pycoll cannot use raises pycoll.BufferError.
bad_calls = {"bitwise AND of floats": lambda: team.allreduce(np.ones(3), op=ReduceOp.BAND),
             "strided buffer": lambda: team.allreduce(np.ones(8)[::2])}
for what, call in bad_calls.items():
    try:
        call()
    except ValueError as exc:
        log.append(f"{what} refused ({type(exc).__name__})")
    else:
        raise AssertionError(f"{what} was accepted")
#    Ranks that disagree (here on the count) all get pycoll.MismatchError, a pycoll.PycollError,
#    at any call number and on any transport. The calls are out of step from then on, so the team
#    takes no more calls (each raises the same error): close it and make a new one.
if size > 1:
    try:
        team.allreduce(np.ones(3 + rank)).wait()
    except pycoll.MismatchError as exc:
        assert isinstance(exc, pycoll.PycollError)
        log.append(f"mismatch caught ({type(exc).__name__})")
    else:
        raise AssertionError("ranks with different counts were not told")
    team.close()
    team = Team.from_mpi(MPI.COMM_WORLD)
y = np.ones(2)
team.allreduce(y).wait()  # a new team works
assert np.all(y == size)
team.close()

if rank == 0:
    print(f"team API on {size} ranks ok: " + "; ".join(log), flush=True)
