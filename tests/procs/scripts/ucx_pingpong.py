"""Ping-pong between ranks 0 and 1 through a team's point-to-point transport itself (not a
collective): round-trip latency and one-way bandwidth at doubling sizes.

    PYCOLL_TLS=ucx mpiexec -n 2 python tests/procs/scripts/ucx_pingpong.py [untagged|checked] [max_bytes]

``untagged`` keys are ``("c", seq, step)`` (UCX: direct tag receives), ``checked`` are user keys
(UCX: header + probed receives). Prints one line per size on rank 0, then ``RANK r OK``.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

from pycoll import Team
from tests.rank import run_rank


def main(kind: str = "untagged", max_bytes: str = str(16 << 20)) -> None:
    team = Team.from_mpi(MPI.COMM_WORLD)
    t, ctx, r = team.transport, team.ctx, team.rank
    assert team.size == 2
    peer = 1 - r

    def wait(*reqs):
        for q in reqs:
            while not q.test():
                if not ctx.progress():
                    pass

    def key(i):
        return ("c", i, 0) if kind == "untagged" else ("u", "pp", i)

    if r == 0:
        print(f"transport {t.name} ({kind} keys)\n{'bytes':>10} {'rtt_us':>10} {'GB/s':>8}", flush=True)
    size = 8
    seq = 0
    while size <= int(max_bytes):
        buf = np.zeros(size, np.uint8)
        iters = max(10, min(2000, (64 << 20) // size))
        team.barrier().wait()
        for phase in ("warm", "time"):
            n = 20 if phase == "warm" else iters
            t0 = time.perf_counter()
            for _ in range(n):
                seq += 1
                if r == 0:
                    wait(t.isend(buf, peer, key(seq)))
                    wait(t.irecv(buf, peer, key(seq)))
                else:
                    wait(t.irecv(buf, peer, key(seq)))
                    wait(t.isend(buf, peer, key(seq)))
            dt = (time.perf_counter() - t0) / n
        if r == 0:
            print(f"{size:>10} {dt * 1e6:>10.2f} {2 * size / dt / 1e9:>8.3f}", flush=True)
        size *= 4
    team.close()


if __name__ == "__main__":
    run_rank(main, *sys.argv[1:])
