"""Run under mpiexec by tests/procs/test_threads.py: two threads of every rank post untagged
allreduces on one team at once (thread A its value 1, thread B 100, 30 each; on rank 0 B posts while
A's first call is in flight). Their order may differ from rank to rank, so their data could pair
wrongly: no rank returns a wrong sum, every rank raises
``pycoll.MismatchError`` (``pycoll.ThreadError`` on a rank that saw the two threads at once) naming
the threads, and the team takes no more calls. The same with a tag per thread: right sums. And one
thread after the other (the first done before the second posts): right sums."""

import sys
import threading

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team
from tests.rank import run_rank


def threads(team, tags, overlap=False):
    """Threads A and B of this rank each post 30 allreduces of ``tags``; their results (None, or
    the MismatchError a thread got). ``overlap``: make the two threads' first calls overlap on rank
    0, where B posts while A's first call waits for the other ranks, which start their threads only
    once rank 0's have posted (under load, threads left alone may take turns without overlapping,
    in another order on each rank: a rank cannot see that, see docs/guide/team.md)."""
    n, world = team.size, MPI.COMM_WORLD
    results = {}
    posted = {"A": threading.Event(), "B": threading.Event()}

    def worker(value, name, tag):
        x = np.full(4, float(value), np.float32)
        try:
            for _ in range(30):
                req = team.allreduce(x.copy(), tag=tag)
                posted[name].set()
                out = req.wait(timeout=30)
                assert (out == n * value).all(), f"thread {name}: a wrong sum {out} (of {value})"
            results[name] = None
        except pycoll.MismatchError as exc:
            results[name] = exc
        finally:
            posted[name].set()

    ts = {name: threading.Thread(target=worker, args=(v, name, tag), name=name)
          for v, name, tag in ((1, "A", tags[0]), (100, "B", tags[1]))}
    if overlap and world.rank != 0:
        world.recv(source=0, tag=77)  # (rank 0's threads have posted)
    for name, t in ts.items():
        t.start()
        if overlap and world.rank == 0:
            posted[name].wait(60)
    if overlap and world.rank == 0:
        for r in range(1, n):
            world.send(True, dest=r, tag=77)
    for t in ts.values():
        t.join(60)
    assert not any(t.is_alive() for t in ts.values()), "a thread hangs"
    return results


def main():
    world = MPI.COMM_WORLD
    team = Team.from_mpi(world)
    results = threads(team, (None, None), overlap=True)
    raised = [e for e in results.values() if e is not None]
    assert raised, f"rank {world.rank}: two threads posted untagged collectives at once and nothing was said"
    for exc in raised:
        assert "'A'" in str(exc) and "'B'" in str(exc) and "tag=" in str(exc), str(exc)
    try:
        team.allreduce(np.ones(2)).wait(timeout=30)
    except pycoll.MismatchError:
        pass
    else:
        raise AssertionError("the team took another call")
    team.close()
    world.Barrier()

    team = Team.from_mpi(world)  # a tag per thread: each thread's collectives match by tag
    assert threads(team, ("a", "b")) == {"A": None, "B": None}
    team.close()
    world.Barrier()

    team = Team.from_mpi(world)  # one thread after the other: the team's poster changes hands
    for name, value in (("A", 1), ("B", 100)):
        t = threading.Thread(target=lambda v=value: team.allreduce(np.full(4, float(v))).wait(timeout=30),
                             name=name)
        t.start()
        t.join(60)
    out = team.allreduce(np.ones(2)).wait(timeout=30)
    assert (out == world.size).all()
    team.close()


if __name__ == "__main__":
    run_rank(main, *sys.argv[1:])
