"""Three ranks on two hosts (tests/launch.py run_hosts: ranks 0 and 1 on host A, rank 2 on host B),
a team through a store on host A over argv 2 (tcp, or ucx). Rank 2 leaves between calls in the
way argv 1 names (``sys_exit``: the interpreter exits, saying so; ``os_exit``: ``os._exit(0)``, its
process ends without a word). Ranks 0 and 1 call a 1 MiB ring allreduce: rank 0
receives from rank 2 (its transport may see it leave), rank 1 only from rank 0, on its own host.
Both must raise PeerLostError naming rank 2 within 2 s of its leaving (each prints
``LOST <rank> <seconds since it left>``); neither exits before both have (so neither learns it
from the other's end).
"""

import os
import sys
import time

import numpy as np

import pycoll
from pycoll import Team
from pycoll.store import TCPStore


def main(rank: int, size: int, way: str, tl: str) -> None:
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=rank == 0,
                     timeout=60)
    team = Team.from_store(store, rank, size)
    assert team.transport.name == tl and team.topology.n_nodes == 2, (team.transport, team.topology)
    big = np.ones(1 << 17)
    for _ in range(2):
        team.allreduce(big.copy(), algorithm="ring").wait()
    store.set(f"ready{rank}", b"1")
    store.wait([f"ready{r}" for r in range(size)])
    if rank == 2:
        store.set("left", repr(time.time()).encode())
        print(f"RANK {rank} OK (leaves: {way})", flush=True)
        if way == "sys_exit":
            sys.exit(0)
        os._exit(0)
    t0 = time.monotonic()
    try:
        team.allreduce(big.copy(), algorithm="ring", timeout=30).wait()
        raise AssertionError(f"rank {rank}: the allreduce finished without rank 2")
    except pycoll.PeerLostError as exc:
        now = time.time()
        since = now - float(store.get("left"))
        print(f"rank {rank} LOST {exc.rank} {since:.3f} s after it left ({time.monotonic() - t0:.3f} s "
              f"waiting): {exc}", flush=True)
        assert exc.rank == 2, exc  # (rank 0 may hear it from the transport first: its own peer)
        assert since < 5, since  # (the target: 2 s; PYCOLL_TIMEOUT is 30 s; the machine is shared)
    store.set(f"reported{rank}", b"1")
    store.wait([f"reported{r}" for r in range(2)])
    print(f"RANK {rank} OK", flush=True)
    if rank == 1:
        store.set("bye", b"1")
    else:
        store.wait(["bye"])  # (it serves the store: until rank 1 had its answer)
        time.sleep(0.5)
    os._exit(0)  # (its team's peer is gone: no goodbyes)


if __name__ == "__main__":
    main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1], sys.argv[2])
