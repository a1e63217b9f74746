"""The UCX transport (PYCOLL_TLS=ucx) in real processes: every collective on 1-8 ranks (teams from
MPI and from a store sharing one worker, both loading orders against mpi4py, UCX_TLS=tcp), a missing
library and a dying rank. In one process (the tag layout's collisions, too-large messages):
tests/unit/test_ucx.py."""

import sys
import textwrap

import pytest

from tests.launch import child_env, need_ucx

need_ucx(allow_module_level=True)


@pytest.mark.parametrize("n,order,env", [
    (1, "mpi-first", {}),
    (2, "mpi-first", {}),  # (UCX over TCP: tests/procs/test_multihost.py, between network namespaces)
    (3, "ucx-first", {}),
    (3, "mpi-first", {"PYCOLL_CHECK": "all"}),  # (every native program runs its check first)
    (4, "mpi-first", {}),
    (5, "ucx-first", {}),
    (8, "ucx-first", {}),  # (6 and 7 dropped to keep the suite under its time)
])
def test_collectives_over_ucx(n, order, env, mpirun):
    mpirun(n, "tests/procs/scripts/ucx_colls.py", order, timeout=240, env={"PYCOLL_TLS": "ucx", **env})


# ------------------------------------------------------------------ failures
def test_missing_library_is_a_transport_error(run_cmd):
    code = """
        import pycoll
        from pycoll.errors import TransportError
        from pycoll.tl.ucx import UCXTransport, info
        for make in (info, lambda: UCXTransport(0, 2, lambda b: [b, b], pycoll.Context())):
            try:
                make()
            except TransportError as exc:
                assert "cannot load libucp" in str(exc) and "nowhere" in str(exc), exc
            else:
                raise AssertionError("no error")
        print("OK")
    """
    rc, out, err = run_cmd([sys.executable, "-c", textwrap.dedent(code)], timeout=60,
                           env=child_env({"PYCOLL_UCX_LIB": "/nowhere/libucp.so.0"}))
    assert rc == 0 and "OK" in out, out + err


#: What the ranks run before rank 1 dies (``before``) and what rank 0 then calls (``after``): a
#: ring allreduce of 1 MiB, or a small allreduce repeated in the express lane (one native call per
#: run, which hands a run still waiting to the engine with the call's deadline).
_DYING = {
    "ring": ("team.allreduce(np.ones(1 << 16)).wait()",
             'team.allreduce(np.ones(1 << 20), algorithm="ring", timeout=5).wait()'),
    "lane": ("""
        from pycoll.tl.ucx.executor import UCXProgramTask
        x, y, runs = np.ones(2, np.float32), np.empty(2, np.float32), []
        plain = UCXProgramTask.express_run
        UCXProgramTask.express_run = lambda task, number: runs.append(number) or plain(task, number)
        for _ in range(500):
            team.allreduce(x, y, timeout=3).wait()
        assert len(runs) > 400 and (y == 2).all(), (len(runs), y)""",
             "for _ in range(100): team.allreduce(x, y, timeout=3).wait()"),
}


@pytest.mark.parametrize("peer_errors,calls", [("auto", "ring"), ("1", "ring"), ("auto", "lane")])
def test_dying_rank_is_an_error_not_a_hang(peer_errors, calls, store_ranks):
    """auto (same node: no peer error mode, so shared memory): the collective's timeout; 1: UCP's
    peer error mode (TCP between local ranks) may report the loss first. Either way a pycoll
    error in time, for a collective posted anew (ring) and for one repeated in the express lane."""
    before, after = _DYING[calls]
    script = textwrap.dedent("""
        import os, sys, time
        import numpy as np
        import pycoll
        from pycoll import Team
        from pycoll.store import TCPStore
        rank, size, port = map(int, sys.argv[1:4])
        store = TCPStore("127.0.0.1", port, timeout=30)
        team = Team.from_store(store, rank, size)
        assert team.transport.name == "ucx", team
        {before}
        if rank == 1:
            # a send complete here may not have reached rank 0 yet: die only once it has
            store.wait(["rank0-done"])
            os._exit(3)
        store.set("rank0-done", "1")
        t0 = time.monotonic()
        try:
            {after}
        except pycoll.PycollError as exc:
            print("ERROR", type(exc).__name__, round(time.monotonic() - t0, 1), exc, flush=True)
            os._exit(0)
        print("NO ERROR", flush=True)
    """).format(before=textwrap.dedent(before).strip(), after=after.replace("\n", "\n    "))
    codes, outs = store_ranks(script, 2, timeout=60,
                              env={"PYCOLL_TLS": "ucx", "PYCOLL_UCX_PEER_ERRORS": peer_errors})
    assert codes[1] == 3, outs[1]
    assert codes[0] == 0 and "ERROR" in outs[0], outs[0]
    took = float(outs[0].split("ERROR", 1)[1].split()[1])
    print(outs[0])
    assert took < 15, outs[0]


@pytest.mark.parametrize("n", [2, 3])
def test_matrix_over_ucx_as_native_programs(n, mpirun):
    """The whole collective matrix (every dtype x op, every algorithm, checked against numpy) on a
    UCX team, where the lowerable algorithms run as native programs (PYCOLL_NATIVE_PROGRAMS: on)."""
    need_ucx()
    mpirun(n, "tests/coll/scripts/matrix.py", "1", "20000", timeout=240, env={"PYCOLL_TLS": "ucx,mpi"})


def test_repeated_v_collective_runs_native_and_is_always_checked(mpirun):
    """A repeated allgatherv over UCX runs as a native program behind the agreement check; counts
    changed in place make a new call; a rank repeating its call and one making the same call on new
    arrays agree; a peer that changes its counts is a MismatchError on both: see
    tests/procs/scripts/v_repeat.py."""
    need_ucx()
    out = mpirun(2, "tests/procs/scripts/v_repeat.py", timeout=60, env={"PYCOLL_TLS": "ucx"})
    assert "rank 0: MismatchError" in out and "rank 1: MismatchError" in out, out
    assert "rank 0: rejection" in out and "rank 1: rejection" in out, out
