"""Run under mpiexec by tests/procs/test_shm_marks.py: call marks on one host's single-copy
point-to-point path (a team over a TCP store, ``tls=["shm", "tcp"]``: ShmTransport's descriptors
and the native executor, ``native/exec_shm.c``), each path given by ``PATH``:

- ``python``: every rank runs the algorithms' schedules in Python (``PYCOLL_NATIVE_PROGRAMS=0``);
- ``native``: every rank runs them as native programs (the default);
- ``mixed``: rank 0 in Python, the others natively (the same descriptors on the rings).

Modes:

- ``mismatch PATH`` (2 ranks): for each disagreement (allreduce float32 against int32 of the same
  size, SUM against MAX, a bcast of another count), a fresh team makes ``number`` agreeing calls of
  the same collective (1, 9, 50: repeated calls run again on the express lane), then rank 1
  differs: every rank raises MismatchError naming both calls, but a bcast's root, which receives
  nothing, may return. At call 9 rank 1 comes late, at call 50 rank 0 (a bcast's rank 1): its
  transport holds the peer's message before the call is posted (the mark compared then, by the
  Python receive or the native program it is handed to). (Recursive doubling: each rank sends
  before it receives, so each finds the other's mark itself, whichever came first; a team made
  from a store has no news of a mismatch, pycoll.news, for a rank whose peer failed before it
  sent.)
- ``results PATH`` (``native`` or ``mixed``): agreeing ranks (2 or 3) get numpy's results at 8 B,
  32 B (in the descriptor), 4 KiB and 1 MiB, for allreduce (rd, ring), bcast (knomial,
  scatter_allgather) and allgather, on new arrays and repeated ones (the express lane), with a
  tagged (Python) call among them.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team
from pycoll.store import TCPStore
from tests.rank import run_rank


def make_team(python: bool) -> Team:
    """A team over a TCP store whose point to point is ShmTransport (``python``: this rank runs no
    native programs)."""
    world = MPI.COMM_WORLD
    server = TCPStore(port=0, is_master=True, timeout=60) if world.rank == 0 else None
    port = world.bcast(server.port if server is not None else None)
    if python:
        os.environ["PYCOLL_NATIVE_PROGRAMS"] = "0"
    try:
        team = Team.from_store(TCPStore("127.0.0.1", port, timeout=60), world.rank, world.size,
                               tls=["shm", "tcp"])
    finally:
        os.environ.pop("PYCOLL_NATIVE_PROGRAMS", None)
    team._server = server  # (kept alive with the team)
    assert type(team.transport).__name__ == "ShmTransport", team.transport
    assert team.planner.marks.on, "the team's calls carry no marks"
    return team


def in_python(path: str) -> bool:
    return path == "python" or (path == "mixed" and MPI.COMM_WORLD.rank == 0)


def check_path(req, python: bool, what: str) -> None:
    """The call ran as its rank's path says (native programs are what this test is about)."""
    native = "[native]" in req.task.name
    assert native != python, f"{what}: {req.task.name} on rank {MPI.COMM_WORLD.rank}"


def cases(r: int):
    """(name, call(team, odd) -> request, the words of each rank's call, root or None): rank 1
    differs from rank 0 when ``odd``."""
    x = np.arange(100, dtype=np.float32)

    def dtype(team, odd):
        return team.allreduce(x.astype(np.int32 if odd else np.float32), algorithm="rd")

    def op(team, odd):
        return team.allreduce(x.copy(), op="max" if odd else "sum", algorithm="rd")

    def count(team, odd):
        # (a smaller one: the root's message is larger than rank 1's receive, whose mark tells it)
        return team.bcast(np.full(1000 - 5 * odd, r, np.float32), root=0, algorithm="knomial")

    yield "allreduce dtype", dtype, ["allreduce 100 x float32 sum", "allreduce 100 x int32 sum"], None
    yield "allreduce op", op, ["allreduce 100 x float32 sum", "allreduce 100 x float32 max"], None
    yield "bcast count", count, ["bcast 4000 x uint8", "bcast 3980 x uint8"], 0


def mismatch(path: str) -> None:
    world, r = MPI.COMM_WORLD, MPI.COMM_WORLD.rank
    python = in_python(path)
    for name, call, words, root in cases(r):
        for number in (1, 9, 50):
            what = f"{name} at call {number} ({path})"
            team = make_team(python)
            for _ in range(number):
                call(team, False).wait(timeout=30)
            late = {1: None, 9: 1, 50: 0 if root is None else 1}[number]
            if r == late:  # (the peer's message waits in this rank's stash when its call is posted)
                time.sleep(0.05)
                while not team.transport.has_stash():
                    team.transport.progress()
                    time.sleep(0.001)
            req = call(team, r == 1)
            check_path(req, python, what)
            try:
                req.wait(timeout=30)
            except pycoll.MismatchError as exc:
                text = str(exc)
                for w in words:
                    assert w in text, f"{what}: {w!r} not in {text!r}"
            else:
                assert r == root, f"{what}: rank {r} got a result, not a MismatchError"
            world.Barrier()
            team.close()
            world.Barrier()


def results(path: str) -> None:
    world, r, n = MPI.COMM_WORLD, MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
    python = in_python(path)
    team = make_team(python)
    rng = np.random.default_rng(5)
    for nbytes in (8, 32, 4096, 1 << 20):
        count = nbytes // 4
        data = rng.integers(-1000, 1000, (n, count)).astype(np.float32)
        outs = {}
        for rep in range(3):  # (a new call, then repeats on the same arrays: the express lane)
            for alg in ("rd", "ring"):
                out = outs.setdefault(alg, np.empty(count, np.float32))
                out[:] = np.nan
                req = team.allreduce(data[r], out, algorithm=alg)
                check_path(req, python, f"allreduce {alg} {nbytes} B")
                req.wait(timeout=30)
                assert np.array_equal(out, data.sum(0)), (alg, nbytes, rep)
            for alg in ("knomial", "scatter_allgather"):
                b = outs.setdefault(alg, np.empty(count, np.float32))
                b[:] = data[1] if r == 1 else np.nan
                req = team.bcast(b, root=1, algorithm=alg)
                check_path(req, python, f"bcast {alg} {nbytes} B")
                req.wait(timeout=30)
                assert np.array_equal(b, data[1]), (alg, nbytes, rep)
            every = outs.setdefault("allgather", np.empty(n * count, np.float32))
            every[:] = np.nan
            req = team.allgather(data[r], every, algorithm="ring")
            check_path(req, python, f"allgather {nbytes} B")
            req.wait(timeout=30)
            assert np.array_equal(every, data.reshape(-1)), (nbytes, rep)
            tagged = np.empty(count, np.float32)
            team.allreduce(data[r], tagged, algorithm="rd", tag=f"t{nbytes}.{rep}").wait(timeout=30)
            assert np.array_equal(tagged, data.sum(0)), (nbytes, rep)
    world.Barrier()
    team.close()


def main(mode: str, path: str) -> None:
    {"mismatch": mismatch, "results": results}[mode](path)
    MPI.COMM_WORLD.Barrier()  # (rank 0 serves the store: it stays until every rank is done with it)


if __name__ == "__main__":
    run_rank(main, *sys.argv[1:])
