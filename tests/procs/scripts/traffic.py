"""Run under mpiexec by tests/procs/test_traffic.py (4 ranks): traffic accounting over real transports.

For every transport (mpi, tcp, shm's single-copy point to point, ucx; those this machine lacks are
skipped with a ``SKIP`` line) a ring allreduce of ``M`` bytes must count exactly 2(n-1)/n*M payload
bytes sent to the right neighbour and received from the left one, tagged and untagged (the MPI and
UCX channels' fast paths), and recursive doubling (MPI's fast ``exchange``) log2(n)*M with its
partner of each step. A receive posted with a larger buffer than its message counts the bytes that
arrived. Prints ``TRAFFIC <transport> ...`` lines for the test's report.
"""

import numpy as np
from mpi4py import MPI

from pycoll import Team
from pycoll.store import TCPStore
from tests.rank import run_rank

M = 96 << 10  # bytes: divisible by 4 ranks' blocks of float32


def ring(world, team, name, tag):
    n, rank = team.size, team.rank
    buf = np.full(M // 4, rank + 1, np.float32)
    world.Barrier()
    team.reset_traffic()
    team.allreduce(buf, tag=tag, algorithm="ring").wait()
    assert (buf == n * (n + 1) // 2).all(), f"{name}: ring allreduce result wrong"
    t = team.traffic()
    want = 2 * (n - 1) * M // n
    right, left = (rank + 1) % n, (rank - 1) % n
    assert t["total"] == {"sent": want, "received": want, "msgs_sent": 2 * (n - 1),
                          "msgs_received": 2 * (n - 1)}, (name, tag, t)
    assert t[right]["sent"] == want and t[left]["received"] == want, (name, tag, t)
    if rank == 0:
        print(f"TRAFFIC {name} ring tag={tag!r}: {M} B allreduce, each rank sent {t['total']['sent']} B "
              f"and received {t['total']['received']} B (2(n-1)/n*M = {want})", flush=True)


def recursive_doubling(world, team, name):
    """Untagged recursive doubling: the MPI channel's fast ``exchange``."""
    n, rank = team.size, team.rank
    buf = np.full(M // 4, rank + 1, np.float32)
    world.Barrier()
    team.reset_traffic()
    team.allreduce(buf, algorithm="rd").wait()
    assert (buf == n * (n + 1) // 2).all(), f"{name}: rd allreduce result wrong"
    t = team.traffic()
    steps = n.bit_length() - 1
    assert t["total"] == {"sent": steps * M, "received": steps * M, "msgs_sent": steps,
                          "msgs_received": steps}, (name, t)
    for s in range(steps):
        assert t[rank ^ (1 << s)]["sent"] == t[rank ^ (1 << s)]["received"] == M, (name, t)


def oversized(world, team, name):
    """Receives into buffers larger than their messages count what arrived: a checked (tagged)
    message, and an untagged one posted straight to the transport."""
    world.Barrier()
    team.reset_traffic()
    if team.rank == 0:
        team.isend(np.arange(100, dtype=np.uint8), 1, tag="small").wait()
        req = team.transport.isend(np.arange(60, dtype=np.uint8), 1, ("c", 65000, 7))
        while not req.test():
            team.transport.progress()
        t = team.traffic()
        assert t[1]["sent"] == 160 and t[1]["msgs_sent"] == 2, (name, t)
    elif team.rank == 1:
        big = np.zeros(1000, np.uint8)
        team.irecv(big, 0, tag="small").wait()
        assert (big[:100] == np.arange(100)).all()
        big2 = np.zeros(1000, np.uint8)
        req = team.transport.irecv(big2, 0, ("c", 65000, 7))
        while not req.test():
            team.transport.progress()
        assert req.nbytes == 60 and (big2[:60] == np.arange(60)).all(), (name, req)
        t = team.traffic()
        assert t[0]["received"] == 160 and t[0]["msgs_received"] == 2, (name, t)
        assert t["total"]["sent"] == 0, (name, t)
    world.Barrier()


def check(world, team, name, untagged=True):
    ring(world, team, name, ("ring", name))
    if untagged:
        ring(world, team, name, None)
    oversized(world, team, name)


def main():
    world = MPI.COMM_WORLD
    assert world.size == 4

    mpi = Team.from_mpi(world, tls=["mpi"])
    assert mpi.transport.name == "mpi" and mpi.shared is None, mpi
    check(world, mpi, "mpi")
    recursive_doubling(world, mpi, "mpi")
    mpi.close()

    server = TCPStore(port=0, is_master=True, timeout=60) if world.rank == 0 else None
    port = world.bcast(server.port if server is not None else None)
    store = TCPStore("127.0.0.1", port, timeout=60)

    tcp = Team.from_store(store, world.rank, world.size, tls=["tcp"])
    assert tcp.transport.name == "tcp" and tcp.shared is None, tcp
    check(world, tcp, "tcp")
    tcp.close()

    shm = Team.from_store(store, world.rank, world.size, tls=["shm", "tcp"])
    if shm.transport.name == "shm":
        check(world, shm, "shm", untagged=False)  # untagged collectives would use the segment
        # the segment algorithms move no message through a transport: nothing is counted
        buf = np.ones(M // 4, np.float32)
        world.Barrier()
        shm.reset_traffic()
        shm.allreduce(buf, algorithm="shm").wait()
        assert (buf == world.size).all()
        assert shm.traffic()["total"]["msgs_sent"] == 0, shm.traffic()
    elif world.rank == 0:
        print(f"SKIP shm: no single-copy point to point here ({shm})", flush=True)
    shm.close()

    try:
        from pycoll.tl.ucx import loader

        loader.load()
        have_ucx = True
    except Exception as exc:  # noqa: BLE001 - any reason UCX cannot load: skip it
        have_ucx = False
        if world.rank == 0:
            print(f"SKIP ucx: {exc}", flush=True)
    if have_ucx:
        ucx = Team.from_mpi(world, tls=["ucx"])
        assert ucx.transport.name == "ucx", ucx
        check(world, ucx, "ucx")
        ucx.close()

    world.Barrier()
    if server is not None:
        server.close()


if __name__ == "__main__":
    run_rank(main)
