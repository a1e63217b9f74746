"""Run under mpiexec by tests/coll/test_programs.py: every lowerable algorithm's programs (lowered
on this process's in-process team, read back from their JSON) run by ``team.run_program`` over the
process team's transport (MPI, UCX with PYCOLL_TLS=ucx, or with ``shm`` a team over a TCP store
whose point-to-point path is the shared segment's single copy), against the algorithm itself on the
same inputs: the same bits on every rank. Several programs in flight at once, too."""

import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import Team, algorithms
from pycoll.lower import loads, lower
from pycoll.lower.record import LOWERED, NotLowerable
from pycoll.lower.verify import make_call
from tests.rank import run_rank


def _team(shm):
    """The team the programs run on: the MPI world's, or (``shm``) one over a TCP store whose
    point-to-point transport is the segment's single copy."""
    world = MPI.COMM_WORLD
    if not shm:
        return Team.from_mpi(world)
    from pycoll.store import TCPStore  # noqa: PLC0415

    server = TCPStore(port=0, is_master=True, timeout=60) if world.rank == 0 else None
    port = world.bcast(server.port if server is not None else None)
    store = TCPStore("127.0.0.1", port, timeout=60)
    team = Team.from_store(store, world.rank, world.size, tls=["shm", "tcp"])
    team._server = server  # (kept alive with the team)
    assert team.transport.name == "shm", team.transport
    return team


def main(mode, shm=""):
    team = _team(shm == "shm")
    if mode == "timeout":
        return timeout(team)
    n, r = team.size, team.rank
    ran = 0
    for coll in LOWERED:
        for name in algorithms.ALGORITHMS[coll]:
            if name in ("shm", "cma", "mapped", "hier"):
                continue
            for count, dtype, op in ((7, "float32", "sum"), (3000, "int32", "max"), (1, "bfloat16", "avg")):
                if coll == "barrier":
                    count = 0
                if coll in ("scan", "exscan") and op == "avg":  # (no prefix reduction)
                    continue
                try:
                    programs = lower(coll, name, n, count, dtype, op, root=n - 1)
                except NotLowerable:
                    continue
                mine = loads(programs[r].dumps())
                want = make_call(team, coll, count, dtype, op, n - 1, False, seed=3)
                team.planner.post(want, 0, None, name, 60, {}).wait()
                got = make_call(team, coll, count, dtype, op, n - 1, False, seed=3)
                req = team.run_program(mine, *_args(coll, got, n - 1))
                native = req.task.name.endswith("[native]")
                assert native == (team.transport.name in ("ucx", "shm")), (req.task.name, team.transport)
                req.wait(timeout=60)
                assert want.dst.tobytes() == got.dst.tobytes(), f"{coll}:{name} {count} x {dtype} {op}"
                ran += 1
    assert ran >= 20, ran
    if r == 0:
        print(f"ran {ran} programs against their algorithms", flush=True)
    # several programs at once, completing in any order
    programs = lower("allreduce", "rd", n, 100)
    xs = [np.full(100, r + k, np.float32) for k in range(4)]
    outs = [np.empty(100, np.float32) for _ in range(4)]
    reqs = [team.run_program(programs[r], x, o) for x, o in zip(xs, outs)]
    for k, req in enumerate(reqs):
        req.wait(timeout=60)
        assert np.all(outs[k] == sum(range(n)) + n * k), outs[k][:3]
    team.close()
    MPI.COMM_WORLD.Barrier()  # (rank 0 serves the store: it stays until every rank is done with it)


def timeout(team):
    """Rank 1 never runs its program: the others' programs time out naming what they wait for."""
    r = team.rank
    programs = lower("allreduce", "rd", team.size, 100)
    x, out = np.ones(100, np.float32), np.empty(100, np.float32)
    if r != 1:
        try:
            team.run_program(programs[r], x, out, timeout=1.0).wait()
            raise AssertionError("the program finished without rank 1")
        except pycoll.TimeoutError as exc:
            text = str(exc)
            assert "rank 1" in text and ("instruction" in text or "recv" in text), text
            if r == 0:
                print(f"rank 0: {text[:300]}", flush=True)
    MPI.COMM_WORLD.Barrier()  # (the team is left unclosed: its collective never finished)


def _args(coll, call, root):
    """The arguments of ``team.<coll>`` that make ``call`` again (same buffers)."""
    if coll in ("allreduce", "reduce_scatter"):
        return (call.src, call.dst, call.op)
    if coll == "reduce":
        return (call.src, call.dst, call.op, root)
    if coll == "bcast":
        return (call.dst, root)
    if coll in ("allgather", "alltoall"):
        return (call.src, call.dst)
    if coll == "gather":
        return (call.src, call.dst if call.dst.size else None, root)
    if coll == "scatter":
        return (call.src if call.src.size else None, call.dst, root)
    if coll in ("scan", "exscan"):
        return (call.src, call.dst, call.op)
    if call.layout is None:
        return ()
    counts, displs = [c for _, c in call.layout], [d for d, _ in call.layout]
    if coll == "allgatherv":
        return (call.src, call.dst, counts, displs)
    if coll == "reduce_scatterv":
        return (call.src, call.dst, counts, call.op)
    if coll == "alltoallv":
        rcounts, rdispls = [c for _, c in call.rlayout], [d for d, _ in call.rlayout]
        return (call.src, call.dst, counts, rcounts, displs, rdispls)
    if coll == "gatherv":
        return (call.src, call.dst if call.dst is not call.src else None, counts, displs, root)
    if coll == "scatterv":
        return (call.src if call.src is not call.dst else None, call.dst, counts, displs, root)
    return ()


if __name__ == "__main__":
    run_rank(main, *(sys.argv[1:] or ["match"]))
