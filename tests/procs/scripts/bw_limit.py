"""Run under mpiexec by tests/procs/test_bw_limit.py (2 ranks, PYCOLL_BW_LIMIT set): the bandwidth limiter
on the tcp, shm (single-copy point to point) and mpi transports.

For each transport rank 0 sends ``TOTAL`` bytes to rank 1 in ``MESSAGES`` messages (engine sends,
posted at once); rank 1 measures from a common barrier until the last has arrived and checks the
throughput against the limit. Then a tagged allreduce (and, over MPI, an untagged one, whose channel
has a fast path the limiter must not miss) must be correct and take at least its bytes over the
limit. Prints ``BW <transport> limit <B/s> measured <B/s>`` lines for the test's report.
"""

import os
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team, config
from pycoll.store import TCPStore
from pycoll.tl.limit import BURST_BYTES
from tests.rank import run_rank

TOTAL = 10 << 20
MESSAGES = 10
LOW, HIGH = 0.6, 1.1  # measured / limit: unlimited runs here reach > 1 GB/s, 50x any test limit


def store_team(world, tls):
    """(team, store server or None) over a TCP store served by rank 0."""
    server = TCPStore(port=0, is_master=True, timeout=60) if world.rank == 0 else None
    port = world.bcast(server.port if server is not None else None)
    team = Team.from_store(TCPStore("127.0.0.1", port, timeout=60), world.rank, world.size, tls=tls)
    return team, server


def close(world, team, server=None):
    team.close()
    world.Barrier()
    if server is not None:
        server.close()


def stream(world, team, name, limit):
    """Rank 0 sends TOTAL bytes to rank 1; rank 1 checks the throughput."""
    assert team.transport.limiter is not None and team.transport.limiter.rate == limit, team.transport
    part = TOTAL // MESSAGES
    bufs = [np.full(part, i + 1, np.uint8) if team.rank == 0 else np.zeros(part, np.uint8)
            for i in range(MESSAGES)]
    team.barrier(tag=("sync", name)).wait()  # connections up, the bucket idle since
    time.sleep(0.05)
    world.Barrier()
    t0 = time.monotonic()
    if team.rank == 0:
        reqs = [team.isend(b, 1, tag=("bw", i)) for i, b in enumerate(bufs)]
    else:
        reqs = [team.irecv(b, 0, tag=("bw", i)) for i, b in enumerate(bufs)]
    pycoll.wait_all(reqs)
    elapsed = time.monotonic() - t0
    if team.rank == 1:
        for i, b in enumerate(bufs):
            assert (b == i + 1).all(), f"{name}: message {i} wrong"
        measured = TOTAL / elapsed
        print(f"BW {name} limit {limit} measured {measured:.0f} ({measured / limit:.3f} of the limit, "
              f"{elapsed:.3f} s)", flush=True)
        assert LOW * limit <= measured <= HIGH * limit, \
            f"{name}: {measured / 1e6:.1f} MB/s measured under a limit of {limit / 1e6:.1f} MB/s"
    world.Barrier()


def allreduce(world, team, name, limit, tag):
    """An allreduce under the limit: correct, and no faster than its bytes allow (on 2 ranks every
    allreduce algorithm sends each rank's whole buffer, or two halves of it)."""
    n = 1 << 20
    buf = np.arange(n, dtype=np.float32) * (team.rank + 1)
    world.Barrier()
    t0 = time.monotonic()
    team.allreduce(buf, tag=tag).wait()
    elapsed = time.monotonic() - t0
    assert np.array_equal(buf, np.arange(n, dtype=np.float32) * 3), f"{name}: allreduce result wrong"
    least = 0.9 * (buf.nbytes - BURST_BYTES) / limit
    print(f"ALLREDUCE {name} tag={tag!r} {buf.nbytes} B in {elapsed:.3f} s (at least {least:.3f} s)",
          flush=True)
    assert elapsed >= least, f"{name}: allreduce of {buf.nbytes} B took {elapsed:.3f} s < {least:.3f} s"
    world.Barrier()


def main():
    world = MPI.COMM_WORLD
    assert world.size == 2
    limit = config.get("PYCOLL_BW_LIMIT")
    assert limit == config.parse_bytes(os.environ["PYCOLL_BW_LIMIT"]) > 0

    tcp, server = store_team(world, ["tcp"])
    assert tcp.transport.name == "tcp" and tcp.shared is None, tcp
    stream(world, tcp, "tcp", limit)
    allreduce(world, tcp, "tcp", limit, ("ar", 0))
    close(world, tcp, server)

    shm, server = store_team(world, ["shm", "tcp"])
    assert shm.transport.name == "shm", f"no single-copy point to point here: {shm}"
    stream(world, shm, "shm", limit)
    allreduce(world, shm, "shm", limit, ("ar", 1))  # tagged: point to point, so limited
    close(world, shm, server)

    mpi = Team.from_mpi(world, tls=["mpi"])
    assert mpi.transport.name == "mpi" and mpi.shared is None, mpi
    stream(world, mpi, "mpi", limit)
    allreduce(world, mpi, "mpi", limit, ("ar", 2))
    allreduce(world, mpi, "mpi", limit, None)  # untagged: MPIChannel's fast path
    close(world, mpi)


if __name__ == "__main__":
    run_rank(main)
