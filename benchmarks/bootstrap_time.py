"""How long making a team takes: ``Team.from_store`` and ``Team.from_mpi``, one after another.

Each rank makes ``--teams`` teams in a row (each closed before the next is made) and times the
making, and the making and closing together; the ranks need no barrier between teams, as making
one is collective. Rank 0 prints the median and the mean per team over several rounds
(``--teams 1 --rounds 30``: the median of 30 teams), and first what the process's first team took
(what a program that makes one team waits: one figure per run, so run it several times). A job
key (PYCOLL_JOB_KEY) is set for store teams unless ``--no-key``.

    python benchmarks/bootstrap_time.py store -n 2 [--teams 20] [--rounds 5]
    mpiexec -n 2 python benchmarks/bootstrap_time.py mpi [--teams 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time


def _time_teams(make, teams: int) -> tuple:
    """Seconds per team of making ``teams`` teams, and of making and closing them."""
    made = spent = 0.0
    for _ in range(teams):
        t0 = time.perf_counter()
        team = make()
        t1 = time.perf_counter()
        team.close()
        made += t1 - t0
        spent += time.perf_counter() - t0
    return made / teams, spent / teams


def _report(what: str, per_round: list) -> None:
    for i, how in enumerate(("made", "made+closed")):
        ms = [t[i] * 1e3 for t in per_round]
        print(f"{what}, {how}: median {statistics.median(ms):.2f} ms, mean {statistics.mean(ms):.2f} ms, "
              f"min {min(ms):.2f} ms "
              f"per team ({', '.join(f'{m:.2f}' for m in ms[:10])}{', ...' if len(ms) > 10 else ''})",
              flush=True)


def store_rank(rank: int, size: int, port: int, teams: int, rounds: int) -> None:
    from pycoll import Team
    from pycoll.store import TCPStore

    store = TCPStore("127.0.0.1", port, timeout=60)
    first = _time_teams(lambda: Team.from_store(store, rank, size), 1)
    _time_teams(lambda: Team.from_store(store, rank, size), 1)  # (warm up: imports, first connections)
    if rank == 0:
        print(f"Team.from_store, {size} ranks, the first team: made {first[0] * 1e3:.2f} ms", flush=True)
    per_round = [_time_teams(lambda: Team.from_store(store, rank, size), teams) for _ in range(rounds)]
    if rank == 0:
        _report(f"Team.from_store, {size} ranks", per_round)


def mpi_rank(teams: int, rounds: int) -> None:
    from mpi4py import MPI

    from pycoll import Team

    comm = MPI.COMM_WORLD
    first = _time_teams(lambda: Team.from_mpi(comm), 1)
    _time_teams(lambda: Team.from_mpi(comm), 1)
    if comm.Get_rank() == 0:
        size = comm.Get_size()
        print(f"Team.from_mpi, {size} ranks, the first team: made {first[0] * 1e3:.2f} ms", flush=True)
    per_round = [_time_teams(lambda: Team.from_mpi(comm), teams) for _ in range(rounds)]
    if comm.Get_rank() == 0:
        _report(f"Team.from_mpi, {comm.Get_size()} ranks", per_round)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("how", choices=("store", "mpi"))
    parser.add_argument("-n", type=int, default=2, help="ranks (store: started here)")
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-key", action="store_true", help="store teams without PYCOLL_JOB_KEY")
    parser.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.how == "mpi":
        mpi_rank(args.teams, args.rounds)
        return
    if args.rank >= 0:
        store_rank(args.rank, args.n, args.port, args.teams, args.rounds)
        return
    from pycoll.store import TCPStore

    server = TCPStore(port=0, is_master=True, timeout=60)
    env = dict(os.environ)
    if not args.no_key:
        env["PYCOLL_JOB_KEY"] = secrets.token_hex(32)
    each = [sys.executable, __file__, "store", "-n", str(args.n), "--teams", str(args.teams),
            "--rounds", str(args.rounds), "--port", str(server.port)]
    procs = [subprocess.Popen([*each, "--rank", str(r)], env=env) for r in range(args.n)]
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        server.close()
    raise SystemExit(max(codes))


if __name__ == "__main__":
    main()
