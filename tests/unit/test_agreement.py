"""The agreement check of collectives off the shared segment (pycoll.agreement): which calls are
checked, what a fingerprint holds, and in-process teams whose ranks disagree."""

import threading

import numpy as np
import pytest

import pycoll
from pycoll import agreement
from pycoll.calls import allreduce, bcast


def test_which_calls_are_checked():
    """The exchange: the v-collectives under ``on``, every one under ``all``, none under ``off``
    (rejections: under every mode, see the planner); every other call is checked by its marks."""
    assert [c for c in ("allreduce", "bcast", "allgatherv", "scatterv") if agreement.due(c, "on")] == \
        ["allgatherv", "scatterv"]
    assert agreement.due("allreduce", "all") and not agreement.due("gatherv", "off")
    assert agreement.on_segment("allreduce", "shm") and agreement.on_segment("alltoall", "cma")
    assert not agreement.on_segment("allgather", "cma")  # reads peers' memory, over messages
    assert not agreement.on_segment("allreduce", "ring")


def test_fingerprints_say_what_must_agree():
    x = np.ones(100, np.float32)
    a = agreement.fingerprint(allreduce(0, 2, x, None, "sum"), "ring")
    assert agreement.describe(a) == "allreduce 100 x float32 sum"
    b = agreement.fingerprint(allreduce(0, 2, x.view(np.int32), None, "max"), "ring")
    assert agreement.describe(b) == "allreduce 100 x int32 max"
    c = agreement.fingerprint(bcast(1, 2, np.ones(3, np.int64), 1), "knomial")
    assert agreement.describe(c).endswith("root 1")
    text = agreement.disagreement(np.stack([a, b]), "ring")
    assert "rank 0: allreduce 100 x float32 sum; rank 1: allreduce 100 x int32 max" in text
    assert agreement.disagreement(np.stack([a, a]), "ring") is None


def test_in_process_ranks_that_disagree_raise_on_every_rank_under_all(monkeypatch):
    """``PYCOLL_CHECK=all``: the exchange before the call; every rank names every rank's call, and
    the team goes on (nothing was sent)."""
    monkeypatch.setenv("PYCOLL_CHECK", "all")
    teams = pycoll.local_teams(3)
    bufs = [np.ones(8, np.int32 if r == 2 else np.float32) for r in range(3)]
    reqs = [t.allreduce(b) for t, b in zip(teams, bufs)]
    for req in reqs:
        with pytest.raises(pycoll.MismatchError, match="rank 2: allreduce 8 x int32 sum"):
            req.wait(timeout=10)
    # the team goes on: the next calls agree and compute
    out = [t.allreduce(np.full(4, r + 1.0)) for r, t in enumerate(teams)]
    assert all((req.wait(timeout=10) == 6.0).all() for req in out)


@pytest.mark.parametrize("number", [0, 1, 8, 9, 10, 50, 100])
def test_marks_catch_a_mismatch_at_any_call_number(number):
    """Under the default every message carries its call's mark: ranks that disagree at call
    ``number`` of a long-lived team raise MismatchError naming both calls, and the team then takes
    no more calls on any rank."""
    teams = pycoll.local_teams(3)
    for _ in range(number):
        reqs = [t.allreduce(np.full(4, r + 1.0, np.float32)) for r, t in enumerate(teams)]
        assert all((req.wait(timeout=10) == 6.0).all() for req in reqs)
    bufs = [np.ones(8, np.int32 if r == 2 else np.float32) for r in range(3)]
    reqs = [t.allreduce(b) for t, b in zip(teams, bufs)]
    for req in reqs:
        with pytest.raises(pycoll.MismatchError, match="allreduce 8 x int32 sum"):
            req.wait(timeout=10)
    for t in teams:
        with pytest.raises(pycoll.MismatchError, match="out of step"):
            t.allreduce(np.ones(8, np.float32))


def test_a_call_no_message_told_apart_is_caught_at_the_next_message():
    """Two ranks that each take themselves for a bcast's root receive nothing in it: the history
    word of the next call's marks tells them apart."""
    teams = pycoll.local_teams(2)
    reqs = [t.bcast(np.full(4, r, np.float32), root=r, algorithm="knomial") for r, t in enumerate(teams)]
    for req in reqs:
        req.wait(timeout=10)  # (each rank was a root: nothing to compare yet)
    reqs = [t.allreduce(np.ones(4, np.float32)) for t in teams]
    for req in reqs:
        with pytest.raises(pycoll.MismatchError, match="not on the calls before it"):
            req.wait(timeout=10)


def test_off_adds_no_exchange(monkeypatch):
    """PYCOLL_CHECK=off: no exchange (what the check costs, measured against it)."""
    monkeypatch.setenv("PYCOLL_CHECK", "off")
    teams = pycoll.local_teams(2)
    reqs = [t.allreduce(np.ones(4, np.float32)) for t in teams]
    assert all((req.wait(timeout=10) == 2.0).all() for req in reqs)
    assert all(type(req.task).__name__ != "CheckedCall" for req in reqs)


@pytest.mark.parametrize("coll", ["scan", "exscan"])
def test_scan_ops_that_differ_raise(coll):
    """A prefix reduction reduces: its op must agree (the table says so; the check reads it)."""
    teams = pycoll.local_teams(2)
    reqs = [getattr(t, coll)(np.ones(4, np.float32), op="max" if r else "sum") for r, t in enumerate(teams)]
    for req in reqs:
        with pytest.raises(pycoll.MismatchError, match=rf"rank 0: {coll} 4 x float32 sum( \(this rank\))?; "
                                                       rf"rank 1: {coll} 4 x float32 max"):
            req.wait(timeout=10)


def test_the_check_reads_the_table():
    """What must agree comes from the table of collectives alone (no list of its own to drift)."""
    from pycoll.collectives import TABLE

    for row in TABLE:
        assert row.agreed in ("src", "dst", "") and row.agreed_count in ("size", "counts", "")
        assert (row.name in agreement.ALWAYS) == row.vector
        assert not row.agreed_count or row.agreed  # (a count is a buffer's)


@pytest.mark.parametrize("alg", ["rd", "ring", "knomial"])
def test_a_rank_with_nothing_to_move_still_tells(alg):
    """A marked allreduce of 0 elements still exchanges its empty messages: a peer with 3 is told,
    instead of waiting for them."""
    teams = pycoll.local_teams(3)
    reqs = [t.allreduce(np.ones(3 if t.rank == 2 else 0, np.float32), algorithm=alg) for t in teams]
    for req in reqs:
        try:
            req.wait(timeout=10)
        except pycoll.MismatchError:
            continue
        assert req.task is not None  # (a rank whose part told it nothing may return ...)
    with pytest.raises(pycoll.MismatchError):  # (... and raises at its next call)
        teams[0].allreduce(np.ones(1)).wait(timeout=10)


def test_messages_no_receive_takes_are_looked_at():
    """One rank's allreduce against another's bcast: their messages go to other steps, so no
    receive compares their marks; the waiting ranks find the other's among those no receive took."""
    teams = pycoll.local_teams(2)
    reqs = [teams[0].allreduce(np.ones(4, np.float32)), teams[1].bcast(np.ones(4, np.float32))]
    for req in reqs:
        with pytest.raises(pycoll.MismatchError, match="bcast 16 x uint8 root 0"):
            req.wait(timeout=10)


def test_a_longer_message_whose_mark_landed_names_both_calls():
    """A receive whose peer's message was longer (MPI fills the receive as far as it goes, its mark
    included) names the peer's call; with no mark to read it says the message was longer."""
    mine = agreement.mark_fields(allreduce(1, 3, np.ones(4, np.float32), None, "sum"), "rd") + bytes(8)
    theirs = agreement.mark_fields(allreduce(2, 3, np.ones(5, np.float32), None, "sum"), "rd") + bytes(8)
    text = agreement.explain(mine, theirs, 1, 2, -1, 16)
    assert "rank 1: allreduce 4 x float32 sum (this rank)" in text, text
    assert "rank 2: allreduce 5 x float32 sum" in text, text
    for unread in (b"", bytes(32), mine):
        assert "is longer than this rank" in agreement.explain(mine, unread, 1, 2, -1, 16)


def test_the_look_for_strays_holds_the_engine_lock_from_any_thread():
    """The engine's watches run in whichever thread waits, the progress thread's included, without
    the engine's lock: the look at the transport's unclaimed messages (which moves the transport's
    messages, and ran at once with the caller's own progress: two threads took the same
    descriptor, a send was lost and DDP under mpiexec hung) takes the lock itself."""
    teams = pycoll.local_teams(2)
    try:
        req = teams[0].allreduce(np.ones(4, np.float32))  # (waits for rank 1, which posts nothing)
        transport, lock = teams[0].transport, teams[0].ctx.lock
        real, held = transport.stray, []

        def stray(key, mark):
            held.append(lock._is_owned())
            return real(key, mark)

        transport.stray = stray
        looker = threading.Thread(target=teams[0].planner.marks.strays)
        looker.start()
        looker.join(timeout=30)
        assert held == [True], held
        teams[1].allreduce(np.ones(4, np.float32)).wait(timeout=10)
        req.wait(timeout=10)
    finally:
        for t in teams:
            t.close()
