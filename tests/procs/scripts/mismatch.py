"""Run under mpiexec by tests/procs/test_shm.py: ranks that call a collective with arguments that
must agree and do not (count, dtype, op, root, the collective itself, v-counts), on the shared
segment (``segment``) or off it (``p2p``: PYCOLL_TLS without shm, the marks and exchange of
pycoll.agreement), through the Team API and through ``pycoll.mpi.Comm``: every rank raises
``pycoll.MismatchError`` naming the calls, and no rank returns a result. On the segment each rank
names every rank's call (a gather's block sizes are known at the root alone: the root raises; the
others, which have no output, may return). Off it a rank raises naming its own call and that of
the peer whose message told it (the v-forms, checked by the exchange: every rank's call), and a
rank whose part received nothing that told it (a bcast's root) returns and raises at its next
call, naming what the rank that found it saw; the team then takes no more calls."""

import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team
from pycoll.mpi import Comm
from tests.rank import run_rank


def cases(r, n):
    """(name, call(team), words every rank's message must hold): rank n-1 differs from the rest."""
    odd = r == n - 1
    for count in (4, 1000, 300_000):  # inline on the flag's line, one chunk, several chunks
        yield (f"allreduce count {count}", lambda t, c=count: t.allreduce(np.ones(c + odd, np.float32)),
               [f"allreduce {count} x float32 sum", f"allreduce {count + 1} x float32 sum"])
    for count in (4, 1000):  # nothing to reduce on all ranks but one
        yield (f"allreduce count 0 against {count}",
               lambda t, c=count: t.allreduce(np.ones(c if odd else 0, np.float32)),
               ["allreduce 0 x float32 sum", f"allreduce {count} x float32 sum"])
    for count in (2, 1000):  # (small bcasts on 3+ ranks take the slots; with nothing to move, inline)
        yield (f"bcast count 0 against {count}",
               lambda t, c=count: t.bcast(np.ones(c if odd else 0, np.float32)),
               ["bcast 0 x uint8", f"bcast {4 * count} x uint8"])  # (a bcast moves bytes)
    for coll in ("scan", "exscan"):
        yield (f"{coll} count 0 against 2",
               lambda t, c=coll: getattr(t, c)(np.ones(2 if odd else 0, np.float32)),
               [f"{coll} 0 x float32", f"{coll} 2 x float32"])
    yield ("allreduce dtype", lambda t: t.allreduce(np.ones(100, np.float64 if odd else np.float32)),
           ["x float32", "x float64"])
    yield ("allreduce dtype of the same size",
           lambda t: t.allreduce(np.ones(100, np.int32 if odd else np.float32)),
           ["100 x float32", "100 x int32"])
    yield ("allreduce op", lambda t: t.allreduce(np.ones(100, np.float32), op="max" if odd else "sum"),
           ["float32 sum", "float32 max"])
    yield ("allreduce sum against avg",
           lambda t: t.allreduce(np.ones(100, np.float32), op="avg" if odd else "sum"),
           ["float32 sum", "float32 avg"])
    yield ("bcast root", lambda t: t.bcast(np.ones(100, np.float32), root=n - 1 if odd else 0),
           ["root 0", f"root {n - 1}"])
    yield ("reduce root", lambda t: t.reduce(np.ones(100, np.float32), np.empty(100, np.float32),
                                             root=n - 1 if odd else 0), ["root 0", f"root {n - 1}"])
    yield ("allreduce against bcast", lambda t: (t.bcast(np.ones(100, np.float32)) if odd
                                                 else t.allreduce(np.ones(100, np.float32))),
           ["allreduce", "bcast"])
    yield ("allgather count", lambda t: t.allgather(np.ones(10 + odd, np.float32),
                                                    np.empty(n * (10 + odd), np.float32)),
           ["allgather 10 x float32", "allgather 11 x float32"])
    counts = [3] * n if odd else [2] + [3] * (n - 1)
    yield ("allgatherv counts", lambda t: t.allgatherv(np.ones(counts[r], np.float32),
                                                       np.empty(sum(counts), np.float32), counts),
           ["allgather"])
    if r == 0:
        yield ("gather block",
               lambda t: t.gather(np.ones(5, np.float32), np.empty(n * 5, np.float32), root=0),
               ["gather 5 x float32", "gather 6 x float32"])
    else:
        yield ("gather block", lambda t: t.gather(np.ones(5 + odd, np.float32), None, root=0), None)


def expect_mismatch(name, post, words, mpi=False, after=None):
    """``post()`` raises MismatchError holding ``words`` (None: it may also return); ``mpi``: an
    ``MPI.Exception`` of class ``MPI.ERR_TRUNCATE`` too, as mpi4py users catch it. ``after``: the
    rank's next call, which may raise it instead where ``post()`` returned (off the segment)."""
    try:
        post()
    except pycoll.MismatchError as exc:
        if mpi:
            assert isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE, repr(exc)
        text = str(exc)
        for w in words or ():
            assert w in text, f"{name}: {w!r} not in {text!r}"
        assert text.count("rank ") >= 2 and ": " in text, text
        return
    if words is None:
        return
    if after is not None:
        try:
            after()
        except pycoll.MismatchError as exc:
            # (told by the news of a peer that raised, or found by the history its next marks carry)
            assert "out of step" in str(exc) or "not on the calls before it" in str(exc), str(exc)
            return
    raise AssertionError(f"{name}: rank {MPI.COMM_WORLD.rank} got a result, not a MismatchError")


def main(where):
    world = MPI.COMM_WORLD
    r, n = world.rank, world.size
    for name, call, words in cases(r, n):
        team = Team.from_mpi(world)
        assert (team.shared is not None) == (where == "segment"), f"these checks are for {where}"
        after = None if where == "segment" else lambda t=team: t.allreduce(np.ones(2)).wait(timeout=30)
        expect_mismatch(name, lambda c=call, t=team: c(t).wait(timeout=30), words, after=after)
        team.close()
        world.Barrier()
    if where == "p2p":  # every call is checked, at any number of a team's life: #21 and #100 here
        for at in (21, 100):
            team = Team.from_mpi(world)
            for _ in range(at):
                team.allreduce(np.ones(10, np.float32)).wait()
            expect_mismatch(f"allreduce #{at}", lambda t=team: t.allreduce(
                np.ones(10, np.int32 if r == n - 1 else np.float32)).wait(timeout=30),
                ["10 x int32"], after=lambda t=team: t.allreduce(np.ones(2)).wait(timeout=30))
            team.close()
            world.Barrier()
    # the mpi4py drop-in: the same error, on every rank
    odd = r == n - 1
    comm = Comm(world)
    expect_mismatch("Comm.Allreduce count", lambda: comm.Allreduce(np.ones(50 + odd), np.empty(50 + odd),
                                                                   op=MPI.SUM),
                    ["allreduce 51 x float64 sum"], mpi=True,
                    after=None if where == "segment" else lambda: comm.Allreduce(np.ones(2), np.empty(2)))
    comm.team.close()
    world.Barrier()
    # ranks that agree are unaffected: a fresh team computes as before
    team = Team.from_mpi(world)
    out = team.allreduce(np.full(1000, r + 1.0), np.empty(1000)).wait()
    assert (out == n * (n + 1) / 2).all()
    team.close()


if __name__ == "__main__":
    run_rank(main, sys.argv[1] if len(sys.argv) > 1 else "segment")
