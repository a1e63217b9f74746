"""After a failure, the survivors go on: revoke, agree, shrink (pycoll.recovery) in real processes
around a TCP store, on the shared segment and over TCP; the example that trains through a kill; and
an MPI job whose rank raises ends at once instead of leaving its peers to their timeout."""

import re
import sys
import textwrap
import time

import pytest

from tests.launch import ROOT, child_env, mpiexec

REVOKE = textwrap.dedent("""
    import sys, time
    import numpy as np
    import pycoll
    from pycoll import Team
    from pycoll.store import TCPStore

    rank, size, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = TCPStore("127.0.0.1", port, timeout=30)
    team = Team.from_store(store, rank, size)
    team.allreduce(np.ones(8)).wait()
    if rank == 0:  # gives up on the next collective without entering it: the others wait on it
        time.sleep(0.3)
        store.set("t", repr(time.monotonic()))
        team.revoke("test")
    else:
        try:
            team.allreduce(np.ones(100_000)).wait()
            print(f"RANK {rank} RETURNED", flush=True)
        except pycoll.RevokedError as exc:
            print(f"RANK {rank} FREED {time.monotonic() - float(store.get('t')):.3f} {exc}", flush=True)
    try:  # every later call raises at once
        team.bcast(np.ones(4), root=0).wait()
        print(f"RANK {rank} CALLED", flush=True)
    except pycoll.RevokedError:
        pass
    print(f"RANK {rank} AGREE {team.agree(rank != 2)} {team.agree(True)}", flush=True)
    new = team.shrink()
    x = np.full(10, float(rank))
    new.allreduce(x).wait()
    print(f"RANK {rank} SHRUNK {new.size} {x[0]:g} {team.revoked} {new.revoked}", flush=True)
    # three agreements (two agree, the shrink's): the store keeps the last two's keys only
    kept = [store.check([f"{team.name}/agree{e}/{rank}"]) for e in range(3)]
    print(f"RANK {rank} KEYS {kept}", flush=True)
    new.close()
    team.close()
""")


@pytest.mark.parametrize("tls", ["shm,tcp", "tcp"])
def test_revoke_frees_the_waiting_ranks_and_the_team_agrees_and_shrinks(tls, store_ranks):
    _, outs = store_ranks(REVOKE, 3, timeout=60, env={"PYCOLL_TLS": tls, "PYCOLL_TIMEOUT": "30"})
    text = "\n".join(outs)
    for r in (1, 2):
        # (told by the store: "... revoked by rank 0: test"; on the segment: "rank 0 ... revoked the team")
        freed = re.search(rf"RANK {r} FREED (\S+) .*(revoked by rank 0|rank 0 .*revoked the team)", outs[r])
        assert freed, text
        assert float(freed.group(1)) < 1.0, text  # within WATCH_S (or at once on the segment)
    assert "CALLED" not in text and "RETURNED" not in text, text
    for r in range(3):
        assert f"RANK {r} AGREE False True" in outs[r], text
        assert f"RANK {r} SHRUNK 3 3 True False" in outs[r], text  # a shrink of nobody lost: all 3
        assert f"RANK {r} KEYS [False, True, True]" in outs[r], text


KILLED_IN_AGREE = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    from pycoll import Team
    from pycoll.store import TCPStore

    rank, size, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = TCPStore("127.0.0.1", port, timeout=30)
    team = Team.from_store(store, rank, size)
    if rank == 2:
        store.set("pid", str(os.getpid()))
        team.agree(False)  # killed in here, waiting for rank 0, after it gave its flag
        print("RANK 2 RETURNED", flush=True)
    if rank == 0:
        time.sleep(0.5)
        os.kill(int(store.get("pid")), signal.SIGKILL)
    first = team.agree(True)  # rank 2's flag counts: it gave it before it died
    second = team.agree(True)  # rank 2 is gone: only the survivors' flags
    new = team.shrink()
    x = np.full(10, float(rank))
    new.allreduce(x).wait()
    print(f"RANK {rank} {first} {second} {new.size} {x[0]:g}", flush=True)
    new.close()
""")


def test_a_rank_killed_during_an_agreement(store_ranks):
    _, outs = store_ranks(KILLED_IN_AGREE, 3, timeout=60, env={"PYCOLL_TIMEOUT": "30"})
    text = "\n".join(outs)
    assert "RANK 2 RETURNED" not in text, text
    for r in (0, 1):
        assert f"RANK {r} False True 2 1" in outs[r], text


DIES_IN_SHRINK = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import pycoll
    import pycoll.bootstrap
    from pycoll import Schedule, Team
    from pycoll.store import TCPStore

    rank, size, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = TCPStore("127.0.0.1", port, timeout=30)
    team = Team.from_store(store, rank, size)
    team.allreduce(np.ones(8)).wait()
    if rank == 0:
        time.sleep(0.3)
        team.revoke("test")
    else:  # waiting in a schedule of the user's, and in a receive: both freed
        sched = Schedule(name="user")
        sched.add(team.task("allreduce", np.ones(1000)))
        for what, req in (("SCHED", team.ctx.submit(sched)), ("RECV", team.irecv(np.empty(4), 0, tag=7))):
            try:
                req.wait(timeout=20)
            except pycoll.RevokedError:
                print(f"RANK {rank} {what} REVOKED", flush=True)
    if rank == 2:  # dies in the middle of the shrink's bootstrap
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        pycoll.bootstrap.connect_mesh = die
    t0 = time.monotonic()
    try:
        team.shrink()
    except pycoll.PeerLostError as exc:
        print(f"RANK {rank} SHRINK LOST {time.monotonic() - t0:.3f} {exc}", flush=True)
    new = team.shrink()  # again: the two of them
    x = np.full(4, float(rank))
    new.allreduce(x).wait()
    print(f"RANK {rank} SHRUNK {new.size} {x[0]:g}", flush=True)
""")


@pytest.mark.parametrize("tls", ["shm,tcp", "tcp"])
def test_a_rank_that_dies_in_a_shrink_and_the_calls_a_revoke_frees(tls, store_ranks):
    """A revoke frees a rank waiting in a schedule of its own and in a receive; a rank that dies
    during the shrink's bootstrap makes the others raise PeerLostError at once (on the segment: its
    process is gone though it said it revoked; over TCP: its connections closed), and a second
    shrink gives the two survivors a team."""
    _, outs = store_ranks(DIES_IN_SHRINK, 3, timeout=60, env={"PYCOLL_TLS": tls, "PYCOLL_TIMEOUT": "30"})
    text = "\n".join(outs)
    for r in (1, 2):
        assert f"RANK {r} SCHED REVOKED" in outs[r] and f"RANK {r} RECV REVOKED" in outs[r], text
    for r in (0, 1):
        lost = re.search(rf"RANK {r} SHRINK LOST (\S+) .*rank 2 left during the shrink", outs[r])
        assert lost and float(lost.group(1)) < 2.0, text
        assert f"RANK {r} SHRUNK 2 1" in outs[r], text


@pytest.mark.parametrize("tls", ["shm,tcp", "tcp"])
def test_the_example_loop_survives_a_killed_rank(tls, run_cmd):
    cmd = [sys.executable, str(ROOT / "examples" / "fault_tolerant_loop.py"), "-n", "3", "--victim", "1",
           "--kill-at", "2", "--steps", "4", "--timeout", "60"]
    rc, out, err = run_cmd(cmd, timeout=90, env=child_env({"PYCOLL_TLS": tls}), merge=True)
    assert rc == 0, out
    after = [float(t) for t in re.findall(r"on 2 ranks (\S+) s after the kill", out)]
    assert len(after) == 2 and max(after) < 2.0, out  # both survivors, computing within 2 s


RAISES = textwrap.dedent("""
    import sys, time
    import numpy as np
    from mpi4py import MPI
    import pycoll
    from pycoll import Team

    team = Team.from_mpi(MPI.COMM_WORLD)
    team.allreduce(np.ones(4)).wait()
    if team.rank == 1:
        raise ValueError("boom")
    try:  # over MPI's point to point nothing tells the others that rank 1 is gone
        team.allreduce(np.ones(4), timeout=60).wait()
    except pycoll.PycollError as exc:
        print("RANK", team.rank, type(exc).__name__, flush=True)
""")


def test_an_uncaught_exception_ends_the_mpi_job(run_cmd):
    """PYCOLL_ABORT_ON_ERROR (on by default): MPI_Abort at the raising rank's exit, as ``python -m
    mpi4py`` does; the job ends with an error status in seconds, not after the others' 60 s."""
    cmd = [mpiexec(), "-n", "3", sys.executable, "-c", RAISES]
    t0 = time.monotonic()
    rc, out, _ = run_cmd(cmd, timeout=50, merge=True, env=child_env({"PYCOLL_TLS": "mpi"}))
    assert rc != 0 and "ValueError: boom" in out, out
    assert time.monotonic() - t0 < 30, out
