"""One rank of a multi-host run (tests/launch.py run_hosts): a team bootstrapped through a TCP store on
the first host, spanning two network namespaces; hierarchical and flat collectives vs numpy.

argv: the transport expected between hosts (tcp | ucx).
"""

import os
import sys
import time
import traceback

import numpy as np

from pycoll import ReduceOp, Team
from pycoll.store import TCPStore


def main(rank, size, between):
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=rank == 0,
                     timeout=60)
    team = Team.from_store(store, rank, size)
    topo = team.topology
    assert topo.n_nodes == 2, topo
    assert team.transport.name == between, team.transport
    lead = team.leaders_team()
    if lead is not None:
        assert lead.transport.name == between and lead.size == 2, lead
    node = team.node_team()
    assert node.size == 1 or node.shared is not None, "node team without a shared segment"

    for alg in ("rab", "split_rail", "ring", None):
        for dtype, op in ((np.float32, ReduceOp.SUM), (np.int64, ReduceOp.MAX), (np.float64, ReduceOp.AVG)):
            for count in (1, 1000, 300001):
                ins = [(np.arange(count) % 7 + r).astype(dtype) for r in range(size)]
                want = {ReduceOp.SUM: sum(ins), ReduceOp.MAX: np.maximum.reduce(ins),
                        ReduceOp.AVG: sum(ins) / size}[op].astype(dtype)
                buf = ins[rank].copy()
                team.allreduce(buf, op=op, algorithm=alg, fragment_bytes=256 << 10).wait()
                assert np.allclose(buf, want), (alg, dtype, op, count, buf[:4], want[:4])
    # the same shapes again on new buffers: hierarchical schedules kept and rebound, not rebuilt;
    # over UCX a flat untagged allreduce runs as a native program
    for i in range(3):
        for alg in ("rab", "split_rail", "ring"):
            buf = np.full(1000, rank + i, np.float64)
            req = team.allreduce(buf, algorithm=alg, fragment_bytes=4096)
            req.wait()
            assert (buf == sum(r + i for r in range(size))).all(), (alg, i, buf[:4])
            if alg == "ring" and between == "ucx":
                assert req.task.name.endswith("[native]"), req.task.name
    for root in range(size):
        buf = np.full(100003, root if rank == root else -1, np.int32)
        team.bcast(buf, root).wait()
        assert (buf == root).all(), root
    for _ in range(5):
        team.barrier().wait()
    team.barrier(algorithm="dissemination").wait()
    t0 = time.monotonic()
    team.close()  # (its sub-teams' too; over UCX a close used to wait 10 s for a peer's flush)
    took = time.monotonic() - t0
    assert took < 5, f"closing the team took {took:.1f} s"
    store.add("closed", 1)  # the store's host (rank 0) stays until every rank has closed its team
    while rank == 0 and store.add("closed", 0) < size:
        time.sleep(0.01)
    store.close()


if __name__ == "__main__":
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        main(rank, size, sys.argv[1])
    except Exception:
        print(f"RANK {rank} FAILED\n{traceback.format_exc()}", flush=True)
        sys.exit(1)
    print(f"RANK {rank} OK", flush=True)
