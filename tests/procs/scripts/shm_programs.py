"""Run under mpiexec by tests/procs/test_shm_programs.py: native programs on one host's single-copy
point-to-point path (a team over a TCP store, ``tls=["shm", "tcp"]``; its executor
``native/exec_shm.c``) against numpy, in the cases where the executor and the transport's Python
code share the rings:

- ``early``: a peer's message reaches this rank's ring before the program starts, and the
  transport stashes it (as it does another collective's): the program takes it from the stash,
  on a new call, a repeated one the engine starts, and one the express lane runs;
- ``mixed``: rank 0 runs the algorithms' schedules in Python (``PYCOLL_NATIVE_PROGRAMS=0``), the
  others run them natively, v-collectives' agreement checks included: the same messages;
- ``interleaved``: tagged collectives (Python) and untagged ones (native) in flight together, so
  that the rings hold both kinds of message, in varying order;
- ``many``: 150 native collectives in flight at once, more than a ring's 64 descriptors to a peer;
- ``held`` (2 ranks): rank 0's program times out with its send posted and drops its arrays; rank 1,
  late, still reads what rank 0 sent (the transport keeps a failed program's buffers while its
  posted messages may be read);
- ``failed`` (2 ranks): rank 1's segment collective times out (it is marked failed on the segment,
  its process alive): programs between the two still run (a failed rank is not a lost one).
"""

import gc
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from pycoll import Team
from pycoll.store import TCPStore
from tests.rank import run_rank


def make_team(native: bool = True) -> Team:
    world = MPI.COMM_WORLD
    server = TCPStore(port=0, is_master=True, timeout=60) if world.rank == 0 else None
    port = world.bcast(server.port if server is not None else None)
    if not native:
        os.environ["PYCOLL_NATIVE_PROGRAMS"] = "0"
    store = TCPStore("127.0.0.1", port, timeout=60)
    team = Team.from_store(store, world.rank, world.size, tls=["shm", "tcp"])
    os.environ.pop("PYCOLL_NATIVE_PROGRAMS", None)
    team._server = server  # (kept alive with the team)
    assert team.transport.name == "shm", team.transport
    return team


def native(req) -> bool:
    return "[native]" in req.task.name  # (the first calls are wrapped in their agreement check)


def early(team: Team) -> None:
    """Rank 0 comes late to two calls (one on new arrays, one repeating them) and makes its transport
    read the ring first: the peers' messages wait in its stash when its program starts."""
    from pycoll.tl.shm.executor import ShmProgramTask  # noqa: PLC0415

    seen = {"early": 0, "express": 0}
    plain_early, plain_run = ShmProgramTask.early, ShmProgramTask._run

    def counted_early(task, *args):
        seen["early"] += 1
        return plain_early(task, *args)

    def counted_run(task, *args):
        seen["express"] += 1
        return plain_run(task, *args)

    ShmProgramTask.early, ShmProgramTask._run = counted_early, counted_run
    n, r = team.size, team.rank
    x = np.full(1000, r + 1.0, np.float32)
    out = np.empty_like(x)
    want = np.full(1000, n * (n + 1) / 2, np.float32)
    for _ in range(10):  # (past the calls behind the agreement check: numbers 10-12 are not)
        req = team.allreduce(x, out, algorithm="rd")
        assert native(req), req.task
        req.wait(timeout=30)
    for fresh, express in ((True, False), (False, False), (False, True)):  # (a repeat's lane: from the 2nd)
        if fresh:
            out = np.empty_like(x)
        if r == 0:
            time.sleep(0.3)  # (the peers have posted their sends)
            for _ in range(50):
                team.transport.progress()  # stashes them: no program runs this collective yet
                if team.transport.has_stash():
                    break
                time.sleep(0.01)
            assert team.transport.has_stash(), "no message was stashed"
        out[:] = 0
        before = dict(seen)
        team.allreduce(x, out, algorithm="rd").wait(timeout=30)
        assert np.array_equal(out, want), (fresh, out[:4])
        if r == 0:  # (the peers' messages handed to the program)
            assert seen["early"] > before["early"], seen
            assert (seen["express"] > before["express"]) == express, (fresh, express, seen)
    team.barrier().wait(timeout=30)


def mixed(team: Team) -> None:
    """Every case against numpy, with rank 0 in Python and the others native (a few calls each,
    repeated so that the express lane runs)."""
    n, r = team.size, team.rank
    rng = np.random.default_rng(7)
    for count in (1, 300, 70_000):
        base = rng.integers(-50, 50, (n, count * n)).astype(np.float32)
        for _ in range(3):
            out = np.empty(count, np.float32)
            for alg in ("rd", "ring"):
                req = team.allreduce(base[r, :count], out, algorithm=alg)
                assert native(req) == (r != 0), (alg, req.task)
                req.wait(timeout=30)
                assert np.array_equal(out, base[:, :count].sum(0)), (alg, count)
            b = base[r, :count].copy() if r == 1 % n else np.zeros(count, np.float32)
            team.bcast(b, root=1 % n, algorithm="knomial").wait(timeout=30)
            assert np.array_equal(b, base[1 % n, :count]), count
            got = np.empty(count * n, np.float32)
            team.allgather(base[r, :count], got, algorithm="bruck").wait(timeout=30)
            assert np.array_equal(got, base[:, :count].reshape(-1)), count
            team.alltoall(base[r], got, algorithm="pairwise").wait(timeout=30)
            assert np.array_equal(got, base[:, r * count:(r + 1) * count].reshape(-1)), count
            counts = [count + k for k in range(n)]
            mine = np.full(counts[r], r, np.float32)
            every = np.empty(sum(counts), np.float32)
            team.allgatherv(mine, every, counts, algorithm="ring").wait(timeout=30)  # (checked: v)
            want = np.concatenate([np.full(c, k, np.float32) for k, c in enumerate(counts)])
            assert np.array_equal(every, want), count


def interleaved(team: Team) -> None:
    """Tagged (Python) and untagged (native) collectives in flight together, 40 rounds."""
    n, r = team.size, team.rank
    for i in range(40):
        count = (1, 5, 2000, 40_000)[i % 4]
        xs = [np.full(count, r + k, np.float64) for k in range(4)]
        outs = [np.empty(count, np.float64) for _ in range(4)]
        reqs = []
        for k in range(4):
            tag = f"t{i}.{k}" if (i + k) % 2 else None
            req = team.allreduce(xs[k], outs[k], tag=tag, algorithm="rd")
            assert native(req) == (tag is None), (tag, req.task)
            reqs.append(req)
        for req in (reqs[::-1] if i % 3 else reqs):
            req.wait(timeout=30)
        for k in range(4):
            assert np.all(outs[k] == sum(range(n)) + n * k), (i, k, outs[k][:3])


def many(team: Team) -> None:
    """150 native allreduces in flight at once (their sends to each peer fill its ring)."""
    n, r = team.size, team.rank
    xs = [np.full(10, r + k, np.int64) for k in range(150)]
    outs = [np.empty(10, np.int64) for _ in range(150)]
    reqs = [team.allreduce(x, o, algorithm="rd") for x, o in zip(xs, outs)]
    assert all(native(q) for q in reqs)
    for k in range(len(reqs) - 1, -1, -1):
        reqs[k].wait(timeout=60)
        assert np.all(outs[k] == sum(range(n)) + n * k), (k, outs[k][:3])


def held(team: Team) -> None:
    """Rank 0's rd times out before rank 1 comes; rank 0 drops its arrays; rank 1 reads 7 + 1."""
    import pycoll  # noqa: PLC0415

    world, r, n = MPI.COMM_WORLD, team.rank, 1 << 20
    for _ in range(12):  # (past the checked calls)
        x = np.ones(n)
        team.allreduce(x, np.empty_like(x), algorithm="rd").wait(timeout=30)
    if r == 0:
        x = np.full(n, 7.0)
        req = team.allreduce(x, np.empty_like(x), algorithm="rd", timeout=0.2)
        assert "[native]" in req.task.name, req.task
        try:
            req.wait()
            raise AssertionError("no timeout")
        except pycoll.TimeoutError:
            pass
        del x, req
        gc.collect()
        junk = [np.full(n, 99.0) for _ in range(4)]  # (would take the freed memory)
    world.Barrier()
    if r == 1:
        x = np.ones(n)
        out = np.empty_like(x)
        team.allreduce(x, out, algorithm="rd").wait(timeout=30)
        assert (out == 8.0).all(), out[:4]
    else:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:  # (rank 0 takes rank 1's message as an unexpected one)
            team.ctx.progress()
            time.sleep(0.002)
        del junk
    world.Barrier()


def failed(team: Team) -> None:
    """A rank whose segment collective failed is still there for point to point."""
    import pycoll  # noqa: PLC0415

    world, r = MPI.COMM_WORLD, team.rank
    x = np.ones(1000)
    out = np.empty_like(x)
    for _ in range(12):
        team.allreduce(x, out, algorithm="rd").wait(timeout=30)
    if r == 1:
        try:
            team.allreduce(x, out, timeout=0.1).wait()  # (the segment's: rank 0 is not there)
            raise AssertionError("no timeout")
        except pycoll.TimeoutError:
            pass
    world.Barrier()
    if r == 0:
        try:
            team.allreduce(x, out).wait(timeout=5)
            raise AssertionError("rank 1's failure was not seen")
        except pycoll.PycollError:
            pass
    world.Barrier()
    for _ in range(3):
        if r == 1:
            time.sleep(0.3)
        req = team.allreduce(x, out, algorithm="rd")
        assert "[native]" in req.task.name, req.task
        req.wait(timeout=30)
        assert (out == 2.0).all(), out[:4]


def main(mode: str) -> None:
    team = make_team(native=not (mode == "mixed" and MPI.COMM_WORLD.rank == 0))
    {"early": early, "mixed": mixed, "interleaved": interleaved, "many": many, "held": held,
     "failed": failed}[mode](team)
    MPI.COMM_WORLD.Barrier()
    team.close()
    MPI.COMM_WORLD.Barrier()  # (rank 0 serves the store: it stays until every rank is done with it)


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
