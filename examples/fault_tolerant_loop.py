"""A loop that survives a rank being killed: revoke, shrink, roll back, finish on the survivors.

Each rank sums a vector over ``--steps`` steps (an allreduce per step, as a training loop
allreduces its gradients). At step ``--kill-at`` rank ``--victim`` is killed (SIGKILL). The
others' collective fails (``PeerLostError``, or ``RevokedError`` for a rank that waited on a
peer that gave up); each one revokes the team, shrinks it to the survivors, agrees with them on
the last step every survivor finished (rolling back to it, as a job restarts from its last
checkpoint) and carries on. Every survivor checks its total against the arithmetic and prints
how long after the kill it was computing again.

    python examples/fault_tolerant_loop.py                       # 4 ranks, rank 2 killed at step 5
    python examples/fault_tolerant_loop.py -n 3 --victim 0 --kill-at 2
    PYCOLL_TLS=tcp python examples/fault_tolerant_loop.py        # over TCP, no shared segment

The ranks are processes started here around a key-value store this process serves (as torchrun's
agent does): the store outlives the failure, and the survivors meet in it to shrink.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import numpy as np

N = 1000  # elements per step


def rank_main(rank: int, size: int, port: int, steps: int, victim: int, kill_at: int) -> int:
    import pycoll
    from pycoll import ReduceOp, Team
    from pycoll.store import TCPStore

    store = TCPStore("127.0.0.1", port, timeout=60)
    team = Team.from_store(store, rank, size)
    totals = [np.zeros(N)]  # totals[s]: the sum after s steps (the checkpoints)
    resumed, members, recovered_after = 0, list(range(size)), None
    step = 0
    while step < steps:
        if rank == victim and step == kill_at:
            store.set("killed", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        x = np.full(N, float(rank + step))
        try:
            team.allreduce(x).wait()
        except pycoll.PycollError as exc:
            print(f"rank {rank}: step {step}: {type(exc).__name__}: {exc}", flush=True)
            team.revoke(f"rank {rank} saw {type(exc).__name__}")
            survivors = team.shrink()
            team.close()
            team = survivors
            done = np.array([step], dtype=np.int64)  # the last step every survivor finished
            team.allreduce(done, op=ReduceOp.MIN).wait()
            step = resumed = int(done[0])
            del totals[step + 1:]
            ranks = np.empty(team.size, dtype=np.int64)
            team.allgather(np.array([rank], dtype=np.int64), ranks).wait()
            members = ranks.tolist()
            recovered_after = time.time() - float(store.get("killed"))
            continue
        totals.append(totals[-1] + x)
        step += 1
    expected = sum(r + s for s in range(resumed) for r in range(size)) + \
        sum(r + s for s in range(resumed, steps) for r in members)
    ok = np.array_equal(totals[-1], np.full(N, float(expected)))
    after = "" if recovered_after is None else \
        f"; lost rank(s) {sorted(set(range(size)) - set(members))}, resumed at step {resumed} on " \
        f"{team.size} ranks {recovered_after:.3f} s after the kill"
    print(f"rank {rank}: {'OK' if ok else 'WRONG'} total {totals[-1][0]:g} (expected {expected}){after}",
          flush=True)
    team.close()
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--victim", type=int, default=2, help="the rank killed (default 2)")
    parser.add_argument("--kill-at", type=int, default=5, help="the step it is killed at (default 5)")
    parser.add_argument("--timeout", type=float, default=60, help="wall-clock limit of the run (s)")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # (a rank started by main)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.rank is not None:
        return rank_main(a.rank, a.n, a.port, a.steps, a.victim, a.kill_at)
    if not 0 <= a.victim < a.n or a.n < 2:
        parser.error("needs -n 2 or more and a victim among the ranks")
    from pycoll.store import TCPStore

    store = TCPStore(port=0, is_master=True, timeout=a.timeout)
    args = [sys.executable, os.path.abspath(__file__), "-n", str(a.n), "--steps", str(a.steps), "--victim",
            str(a.victim), "--kill-at", str(a.kill_at), "--port", str(store.port)]
    procs = [subprocess.Popen([*args, "--rank", str(r)], start_new_session=True) for r in range(a.n)]
    deadline = time.monotonic() + a.timeout
    failed = []
    for r, p in enumerate(procs):
        try:
            rc = p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = "still running at the time limit"
        if r != a.victim and rc != 0:
            failed.append(f"rank {r}: {rc}")
    for p in procs:  # (whatever is left: a rank and whatever it started)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    store.close()
    print("survivors finished correctly" if not failed else "FAILED: " + "; ".join(failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
