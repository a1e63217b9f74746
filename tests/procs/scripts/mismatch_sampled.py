"""Run under mpiexec (3 ranks) by tests/procs/test_shm.py: ranks that disagree on a rooted
collective on the segment (``bcast`` or ``gather``, root 0; rank 2's count differs) past its first
collectives. Under ``PYCOLL_CHECK=auto`` the other ranks of a rooted collective check the root's
call alone on collectives 9-15 of the segment (then on all but those whose number is a power of
two), and a gather's do not wait for the root at all (they compare the root's call within their
next two): the root and (bcast) the rank whose call differs raise MismatchError; a gather's rank
that differs raises it within its next two calls; a rank whose call matches the root's returns
(bcast: with the root's data) and raises at its next call (gather: at one of its next two, as it
runs up to one collective ahead of the root) MismatchError, told by a rank that raised it (or
PeerLostError naming the root or rank 2), within a second. On collective 16, and on
every one under ``PYCOLL_CHECK=all``, every rank raises MismatchError.

``noroot``: every rank gathers to the next rank (no rank takes itself for the root): under auto,
past the first collectives, every rank goes on and raises MismatchError (or PeerLostError, naming
a rank that raised it) within its next two calls; at 16 or under all, MismatchError at once.
``noroot-close``: the same, but every rank closes its team after that gather: the close raises
MismatchError."""

import sys
import time

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team
from tests.rank import run_rank


def call(team, coll, r, count):
    x = np.full(count, float(r), np.float32)
    if coll == "bcast":
        team.bcast(x, root=0).wait(timeout=30)
        return x
    out = np.empty(3 * count, np.float32) if r == 0 else None
    team.gather(x, out, root=0).wait(timeout=30)
    return out


def no_root(team, r, every, then_close):
    """Every rank gathers to the next one; then gathers to rank 0 (the second must not return), or
    closes its team (which must raise)."""
    x = np.full(100, float(r), np.float32)
    try:
        team.gather(x, None, root=(r + 1) % 3).wait(timeout=30)
    except pycoll.MismatchError as exc:
        assert every, f"rank {r} raised at once: {exc}"
        return
    assert not every, f"rank {r} returned"
    try:  # (the next gather may go on without the root too: PC_OWED in native/shm.c)
        if then_close:
            segment = team.shared
            try:
                team.close()
            finally:  # (closed all the same: unmapped, its peers told)
                assert team.shared is None and segment.mm is None and segment.base is None
        else:
            for _ in range(2):
                call(team, "gather", r, 100)
    except pycoll.MismatchError as exc:
        root = (r + 1) % 3  # (its call and its root's, side by side)
        assert "an earlier gather's calls differ" in str(exc) and \
            f"rank {r}: gather 100 x float32 root {root}" in str(exc) and \
            f"rank {root}: gather 100 x float32 root {(r + 2) % 3}" in str(exc), exc
    except pycoll.PeerLostError as exc:  # (a rank that raised it first: it failed)
        assert "failed" in str(exc), exc
    else:
        raise AssertionError(f"rank {r}'s next two calls returned" if not then_close else
                             f"rank {r}'s team closed without a word")


def main(coll, mode, at):
    world = MPI.COMM_WORLD
    r, n = world.rank, world.size
    assert n == 3
    team = Team.from_mpi(world)
    segment = team.shared
    every = mode == "all" or at <= 8 or not at & (at - 1)
    if coll.startswith("noroot"):
        while segment.signed + 1 < at:
            call(team, "gather", r, 100)
        world.Barrier()  # (every rank's last gather settled: it may go on from the next one)
        no_root(team, r, every, coll == "noroot-close")
        world.Barrier()
        return
    while segment.signed + 1 < at:
        out = call(team, coll, r, 100)
        if coll == "bcast":
            assert (out == 0).all()
        elif r == 0:
            assert (out == np.repeat(np.arange(3.0), 100)).all()
    assert segment.signed + 1 == at, (segment.signed, at)
    world.Barrier()  # (every rank's last gather settled: it may go on from the next one)
    words = {"bcast": ("rank 0: bcast 400 x uint8", "rank 2: bcast 404 x uint8"),
             "gather": ("rank 0: gather 100 x float32", "rank 2: gather 101 x float32")}[coll]
    if r == 2:  # (late: a rank that waits sees no differing signature before it may return)
        time.sleep(0.3)
    try:
        out = call(team, coll, r, 100 + (r == 2))
    except pycoll.MismatchError as exc:
        assert every or r == 0 or (coll == "bcast" and r == 2), f"rank {r} raised: {exc}"
        assert words[1] in str(exc) and (r != 0 or words[0] in str(exc)), exc
    else:
        assert not every and r != 0 and (coll == "gather" or r == 1), f"rank {r} got a result"
        if coll == "bcast":
            assert (out == 0).all()
        t0 = time.monotonic()
        try:  # (a gather's rank goes on without the root: its next call may too, not the one after)
            for _ in range(1 if coll == "bcast" else 2):
                call(team, coll, r, 100)
        except pycoll.MismatchError as exc:
            # (the gather's rank that differs finds it itself within its next two; or a rank that
            # raised it told this one: the segment carries the news)
            found = coll == "gather" and r == 2 and words[1] in str(exc) and words[0] in str(exc)
            assert found or "found that the ranks' calls differ" in str(exc), exc
            assert time.monotonic() - t0 < 5.0, (exc, time.monotonic() - t0)
        except pycoll.PeerLostError as exc:
            assert r == 1 or coll == "bcast", (r, exc)  # (naming a rank that failed: the root, or 2)
            assert ("rank 0" in str(exc) or coll == "gather" and "rank 2" in str(exc)) and \
                time.monotonic() - t0 < 5.0, (exc, time.monotonic() - t0)
        else:
            raise AssertionError(f"rank {r}'s next calls returned")
    world.Barrier()


if __name__ == "__main__":
    run_rank(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
