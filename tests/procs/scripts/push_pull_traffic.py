"""push_pull's traffic per role against BytePS's formula (OSDI'20, section 4.1), on real ranks:
python push_pull_traffic.py ROUND...

Each ROUND is one or more ``n:k`` configurations separated by commas, run side by side on
consecutive ranks (``4:2,2:0``: ranks 0-5 are 4 workers and 2 servers, ranks 6-7 two more workers);
rounds run one after the other in the same processes, so that one launch covers several
configurations. The first round must be one configuration of the whole world with the launch's
``PYCOLL_NUM_SERVERS``: it goes the public way (``Team.from_mpi(COMM_WORLD)``); the others build the
same roles on sub-communicators (``pycoll.bootstrap.with_servers``, what ``from_mpi`` does for ``COMM_WORLD``;
a plain team for k = 0).

Every configuration makes one push_pull of a 64 MiB float32 tensor after a reset of the traffic
counters of the team of workers and servers, and checks, within 5%:

* each worker's bytes sent and received (messages to itself left out) against ``M + (n-2)*M_gpu``;
* each server's, counted by the workers (the bytes they sent to it and received from it) and by
  the server itself over its whole life (its counters cannot be reset from here: they also hold the
  1 KiB declaration of the tensor and the workers' 1 KiB goodbyes), against ``n*M_cpu``.

Prints ``TRAFFIC n=.. k=..`` lines (rank 0 of each configuration) with the measured ratios.
"""

import sys

import numpy as np
from mpi4py import MPI

import pycoll.bootstrap as bootstrap
from pycoll import Team
from pycoll.perf import byteps_traffic
from tests.rank import run_rank

M = 64 << 20  # bytes
TOLERANCE = 0.05

#: What this rank's server loops moved: ``world.traffic(include_self=False)["total"]`` at their end.
SERVED = []
_serve = bootstrap.serve


def _counting_serve(world, n, k, me, timeout=None):
    out = _serve(world, n, k, me, timeout)
    SERVED.append(world.traffic(include_self=False)["total"])
    return out


bootstrap.serve = _counting_serve  # what a server rank of bootstrap.with_servers runs


def within(got: float, want: float) -> bool:
    return abs(got - want) <= TOLERANCE * want


def parse(round_: str):
    return [tuple(int(v) for v in cfg.split(":")) for cfg in round_.split(",")]


def measure(team, n: int, k: int) -> None:
    """One worker's part of configuration (n, k): one counted push_pull, then checks."""
    rank = team.rank
    world = team.ps.roles.world if team.ps.roles is not None else team
    assert team.size == n and world.size == n + k, (team.size, world.size, n, k)
    x = np.full(M // 4, rank + 1, np.float32)
    team.comm.Barrier()
    world.reset_traffic()
    team.push_pull(x, name=f"traffic{n}:{k}").wait(timeout=120)
    t = world.traffic(include_self=False)
    want_sum = n * (n + 1) / 2
    assert x[0] == want_sum and x[-1] == want_sum and np.all(x[::40961] == want_sum), "wrong sum"
    formula = byteps_traffic(n, k, M)
    sent, recv = t["total"]["sent"], t["total"]["received"]
    assert within(sent, formula["worker"]) and within(recv, formula["worker"]), \
        (f"n={n} k={k} worker {rank}: sent {sent} B, received {recv} B, formula {formula['worker']:.0f} B", t)
    to_servers = [(t[n + s]["sent"], t[n + s]["received"]) for s in range(k)]
    every = team.comm.gather((sent, recv, to_servers), root=0)
    if rank == 0:
        w_want = formula["worker"]
        w_sent, w_recv = (np.mean([w[i] for w in every]) / w_want for i in (0, 1))
        line = (f"TRAFFIC n={n} k={k} M={M}: worker sent/formula {w_sent:.4f}, "
                f"received/formula {w_recv:.4f} (formula {w_want:.0f} B)")
        for s in range(k):  # what the workers sent to server s it received, and the other way
            s_recv, s_sent = sum(w[2][s][0] for w in every), sum(w[2][s][1] for w in every)
            assert within(s_recv, formula["server"]) and within(s_sent, formula["server"]), \
                f"n={n} k={k} server {s} (by the workers): sent {s_sent} B, received {s_recv} B, " \
                f"formula {formula['server']:.0f} B"
            line += f"; server {s} sent/formula {s_sent / formula['server']:.4f}, received/formula " \
                    f"{s_recv / formula['server']:.4f}"
        if k:
            line += f" (formula {formula['server']:.0f} B)"
        print(line, flush=True)
    team.close()  # goodbye: the servers leave their loop


def check_server(n: int, k: int) -> None:
    """This rank just served configuration (n, k): its own counters against the formula."""
    got = SERVED[-1]
    want = byteps_traffic(n, k, M)["server"]
    assert within(got["sent"], want) and within(got["received"], want), \
        f"n={n} k={k}: a server counted sent {got['sent']} B, received {got['received']} B, " \
        f"formula {want:.0f} B"
    print(f"TRAFFIC n={n} k={k} server {MPI.COMM_WORLD.rank} (own count, control messages included): "
          f"sent/formula {got['sent'] / want:.4f}, received/formula {got['received'] / want:.4f}", flush=True)


def make(comm, n: int, k: int, public: bool):
    """The workers' team of (n, k) on ``comm`` (None on a server rank, once it served)."""
    try:
        if public or k == 0:  # COMM_WORLD with PYCOLL_NUM_SERVERS; or a plain team of workers
            return Team.from_mpi(comm)
        return bootstrap.with_servers(Team, comm, None, None, k)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
        check_server(n, k)
        return None


def main(*rounds: str) -> None:
    world_comm = MPI.COMM_WORLD
    rank = world_comm.rank
    for i, round_ in enumerate(rounds):
        configs = parse(round_)
        if i == 0:
            (n, k), = configs
            assert n + k == world_comm.size, (configs, world_comm.size)
            team = make(world_comm, n, k, public=True)
            if team is not None:
                measure(team, n, k)
            world_comm.Barrier()
            continue
        first, mine = 0, None
        for j, (n, k) in enumerate(configs):
            if first <= rank < first + n + k:
                mine = (j, n, k)
            first += n + k
        assert first <= world_comm.size, (round_, world_comm.size)
        sub = world_comm.Split(mine[0] if mine else MPI.UNDEFINED, rank)
        if mine is not None:
            _, n, k = mine
            try:
                team = make(sub, n, k, public=False)
            finally:
                sub.Free()
            if team is not None:
                measure(team, n, k)
        world_comm.Barrier()


if __name__ == "__main__":
    run_rank(main, *sys.argv[1:])
