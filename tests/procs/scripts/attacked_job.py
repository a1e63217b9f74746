"""A two-rank job of store-made teams that a stranger attacks (tests/procs/test_security.py): it
makes a team through the store at PORT (TCP between the ranks), runs allreduces whose sums it
checks (rank 1 late for one of them, so rank 0's engine waits and watches the store), agrees and
shrinks, and checks that the team was not revoked and the shrink kept both ranks. Rank 1 makes its
team only once the stranger says ``test/go`` (the stranger has had its chance at the bootstrap).

    python attacked_job.py PORT [RANK]   (RANK: else the launcher's PMI_RANK)
"""

import os
import sys
import time

import numpy as np

import pycoll
from pycoll import Team
from pycoll.store import TCPStore


def main() -> None:
    port = int(sys.argv[1])
    rank = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ["PMI_RANK"])
    store = TCPStore("127.0.0.1", port, timeout=30)
    store.set(f"test/pid{rank}", str(os.getpid()))
    print(f"RANK {rank} KEYED {bool(os.environ.get('PYCOLL_JOB_KEY'))}", flush=True)
    if rank == 1:
        store.wait(["test/go"], timeout=30)
    try:
        team = Team.from_store(store, rank, 2)
    except pycoll.PycollError as exc:
        print(f"RANK {rank} REFUSED {type(exc).__name__}: {exc}", flush=True)
        return
    store.set(f"test/team{rank}", team.name)
    n = 1000
    for i in range(4):
        if rank == 1 and i == 1:
            time.sleep(1.0)  # (rank 0 waits inside pycoll: its engine's watch looks at the store)
        x = np.full(n, float(rank + 1 + i))
        team.allreduce(x, algorithm="rd").wait()
        want = float(3 + 2 * i)
        if not (x == want).all():
            print(f"RANK {rank} WRONG call {i}: {x[:4]} instead of {want}", flush=True)
            return
    agreed = team.agree(True)
    new = team.shrink()
    y = np.full(8, float(rank + 1))
    new.allreduce(y).wait()
    print(f"RANK {rank} RESULT agree={agreed} revoked={team.revoked} shrunk={new.size} sum={y[0]:g}",
          flush=True)
    new.close()
    team.close()
    store.close()


if __name__ == "__main__":
    main()
