"""A collective that times out off the shared segment says what each peer does about it: rank 0
posts untagged allreduce #3; rank 1 posts a tagged one instead (waiting inside pycoll); rank 2
sleeps outside pycoll. Rank 0's TimeoutError names rank 1 as not having posted #3 (it posted
#0-#2) with what it waits on, and rank 2 as not answering; rank 1's names rank 0, back in the
program by then, as not answering. Every rank raises within its timeout plus the question's
half second. Run under PYCOLL_TLS=mpi with 3 ranks."""

import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import status

comm = MPI.COMM_WORLD
assert comm.size == 3
team = pycoll.Team.from_mpi(comm)
assert team.shared is None and team.planner.peer_status is not None
x = np.ones(100, np.float32)
for _ in range(3):
    team.allreduce(x).wait()
text = ""
t0 = time.monotonic()
if comm.rank == 0:
    try:
        team.allreduce(x, timeout=1.0).wait()
    except pycoll.TimeoutError as exc:
        text = str(exc)
elif comm.rank == 1:
    try:
        team.allreduce(x, tag="grads", timeout=2.5).wait()
    except pycoll.TimeoutError as exc:
        text = str(exc)
else:
    time.sleep(3.0)
took = time.monotonic() - t0
comm.Barrier()
if comm.rank == 0:
    assert took < 1.0 + status.ASK_S + 0.5, took
    want = "collective #3 of this team: rank 1 has not posted it (posted #0-#2 of this team; waits on: "
    assert want in text, text
    assert "'grads'" in text, text
    assert "rank 2 did not answer within 0.5 s (not waiting inside pycoll" in text, text
elif comm.rank == 1:
    assert took < 2.5 + status.ASK_S + 0.5, took
    assert "collective use 0 of tag 'grads' of this team: " in text, text
    assert "ranks 0, 2 did not answer" in text, text
team.close()  # (its question communicator too)
print(f"RANK {comm.rank} OK", flush=True)
