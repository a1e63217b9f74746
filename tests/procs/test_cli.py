"""The command line: info, run and perf (launching real ranks)."""

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import launch
from tests.launch import ROOT, child_env, launched, read_until


def test_version_and_python_dash_m(run_cmd):
    import pycoll

    script = os.path.join(os.path.dirname(sys.executable), "pycoll")  # the installed entry point
    for argv in ([sys.executable, "-m", "pycoll", "--version"], [script, "--version"]):
        rc, out, err = run_cmd(argv, timeout=60)
        assert rc == 0 and f"pycoll {pycoll.__version__}" in out, (argv, out, err)


def test_info_lists_transports_algorithms_and_every_setting(cli):
    from pycoll.config import SETTINGS

    rc, out, _ = cli("info")
    assert rc == 0
    for word in ("mpi", "local", "tcp", "knomial, mapped, rab, rd, ring, shm"):
        assert word in out
    for name in SETTINGS:
        assert name in out
    assert "chosen for" not in out
    rc, out, _ = cli("info", "-n", "16")
    assert rc == 0 and "chosen for 16 ranks on one host" in out
    assert "  alltoall        1-128M cma" in out and "  scatter         1-128K shm, 256K-128M cma" in out


def test_run_launches_ranks_and_returns_their_status(tmp_path, cli):
    code = (f"from mpi4py import MPI; c = MPI.COMM_WORLD; "
            f"open('{tmp_path}/rank%d' % c.rank, 'w').write('%d of %d' % (c.rank, c.size))")
    rc, _, _ = cli("run", "-n", "3", "--timeout", "60", "--", sys.executable, "-c", code)
    assert rc == 0
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["0 of 3", "1 of 3", "2 of 3"]
    rc, _, _ = cli("run", "-n", "2", "--timeout", "60", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert rc != 0
    rc, _, err = cli("run", "-n", "1", "--timeout", "1", "--", sys.executable, "-c",
                     "import time; time.sleep(30)")
    assert rc == 124 and "did not finish" in err


def test_python_dash_m_pycoll_exits_with_the_commands_status(run_cmd):
    """``python -m pycoll`` is what scripts call: a failing command must not exit 0."""
    rc, _, _ = run_cmd([sys.executable, "-m", "pycoll", "run", "-n", "2", "--timeout", "60", "--",
                        sys.executable, "-c", "raise SystemExit(3)"], timeout=90)
    assert rc != 0
    argv = [sys.executable, "-m", "pycoll", "perf", "reduce", "-n", "2", "--root", "5"]
    rc, _, err = run_cmd(argv, timeout=60)
    assert rc == 2 and "--root 5 is not a rank of 2" in err


def test_run_binds_ranks_to_cores_and_takes_the_mpiexec_named(tmp_path, cli):
    code = (f"import os; from mpi4py import MPI; cpus = sorted(os.sched_getaffinity(0)); "
            f"open('{tmp_path}/rank%d' % MPI.COMM_WORLD.rank, 'w').write(repr(cpus))")
    rc, _, err = cli("run", "-n", "2", "--bind", "core", "--timeout", "60", "--", sys.executable, "-c", code)
    assert rc == 0, err
    cpus = [eval(p.read_text()) for p in sorted(tmp_path.iterdir())]
    if len(os.sched_getaffinity(0)) >= 2:
        assert all(len(c) == 1 for c in cpus) and cpus[0] != cpus[1], cpus
    # auto: pinned only where the ranks do not outnumber the cores
    many = len(os.sched_getaffinity(0)) + 1
    for p in tmp_path.iterdir():
        p.unlink()
    rc, _, err = cli("run", "-n", str(many), "--bind", "auto", "--timeout", "60", "--",
                     sys.executable, "-c", code)
    assert rc == 0, err
    free = sorted(os.sched_getaffinity(0))
    assert [eval(p.read_text()) for p in sorted(tmp_path.iterdir())] == [free] * many
    env = dict(os.environ, PYCOLL_MPIEXEC=str(tmp_path / "no-such-mpiexec"))
    rc, _, err = cli("run", "-n", "1", "--", sys.executable, "-c", "pass", env=env)
    assert rc == 1 and "PYCOLL_MPIEXEC=" in err and "not an executable file" in err


def test_perf_compare_mpi_check_and_json(tmp_path, cli):
    out_json = tmp_path / "perf.json"
    rc, out, err = cli("perf", "allreduce", "-n", "2", "--min-bytes", "8", "--max-bytes", "64K",
                       "--iters", "20", "--check", "--compare", "mpi", "--json", str(out_json))
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert [int(r[1]) for r in rows] == [8 << i for i in range(14)]
    assert all(r[-1] == "ok" for r in rows)
    data = json.loads(out_json.read_text())
    assert data["meta"]["ranks"] == 2 and len(data["rows"]) == 14
    assert all(r["mpi_us"] > 0 and r["avg_us"] > 0 and r["check"] == "ok" for r in data["rows"])
    row = data["rows"][-1]
    assert abs(row["busbw"] - row["algbw"]) < 1e-9  # 2(n-1)/n = 1 for two ranks


def test_perf_listed_sizes(cli):
    rc, out, err = cli("perf", "allgather", "-n", "2", "--sizes", "64K,8,4K", "--iters", "5", "--check")
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert [int(r[1]) for r in rows] == [8, 4096, 65536] and all(r[-1] == "ok" for r in rows)


def test_perf_other_dtype_algorithm_and_ranks(cli):
    rc, out, err = cli("perf", "allreduce", "-n", "3", "--max-bytes", "4K", "--dtype", "bfloat16",
                       "--op", "max", "--algorithm", "knomial", "--iters", "5", "--check")
    assert rc == 0, err
    assert "3 ranks, bfloat16, op max, algorithm knomial" in out
    rc, out, err = cli("perf", "allreduce", "-n", "2", "--op", "band", "--max-bytes", "64")
    assert rc != 0 and "BAND is not defined for float32" in out + err


def _mpich_shm(paths: list) -> list:
    """Those of ``paths`` that are MPICH's shared memory of a node's ranks."""
    return [p for p in paths if os.path.basename(p).startswith("mpich_shm_")]


def _pycoll_run(job: launch.Launch, n: int, script, *args: str, timeout: str = "100") -> subprocess.Popen:
    """``pycoll run -n N --timeout T -- python SCRIPT ARGS`` in the launch ``job`` (output piped)."""
    argv = [sys.executable, "-m", "pycoll.cli", "run", "-n", str(n), "--timeout", timeout, "--",
            sys.executable, str(script), *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**child_env(), **job}, cwd=str(ROOT))


def _finish(proc: subprocess.Popen, job: launch.Launch, lines: str, timeout: float = 60) -> str:
    """The rest of ``pycoll run``'s output once it has exited; if it does not within ``timeout``
    seconds, fail the test naming the ranks of its job still running (and its output)."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        ranks = []
        for pid in launch.tagged(job.tag):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
                ranks += [f"rank {env[b'PMI_RANK'].decode()} (pid {pid})"] if b"PMI_RANK" in env else []
        proc.kill()
        out = proc.communicate()[0]
        pytest.fail(f"pycoll run did not exit within {timeout} s; still running: {ranks or 'no rank'}\n"
                    f"{(lines + out)[-4000:]}")


@pytest.mark.parametrize("how", ["timeout", "ctrl-c", "ctrl-c ignored", "sigterm", "sigterm again and again",
                                 "sighup"])
def test_run_ends_its_ranks_and_leaves_no_shared_memory(how, tmp_path):
    """``pycoll run`` ended by ``--timeout``, Ctrl-C (SIGINT), SIGTERM (an outer ``timeout``) or
    SIGHUP (its terminal closed), with ranks that are inside MPI (MPICH's shared memory mapped) and
    may ignore SIGINT: every rank ends (SIGINT, then SIGKILL), the status is 124, 130, 143 or 129,
    and what the job made in /dev/shm and /tmp is gone. SIGTERM sent again and again until it
    exits (the first while the ranks run, the others while it ends them and removes their files)
    only cuts the ranks' grace short: it still exits 143, having removed everything (it never dies
    of the signal)."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent(f"""
        import signal, time
        import numpy as np
        from mpi4py import MPI
        c = MPI.COMM_WORLD
        b = np.empty(1000)
        c.Allreduce(np.ones(1000), b)
        if {how.startswith(("ctrl-c ignored", "sigterm"))!r}:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"UP {{c.rank}}", flush=True)
        time.sleep(120)
    """))
    with launched(f"pycoll run ({how})") as job:
        proc = _pycoll_run(job, 2, script, timeout="4" if how == "timeout" else "100")
        lines = read_until(proc, "UP", 2, 60, f"pycoll run ({how})")
        made = job.files.present()
        assert _mpich_shm(made), f"the job's shared memory was not found: {made}"
        if how == "sigterm again and again":
            deadline = time.monotonic() + 60  # (then communicate's limit fails the test)
            while proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                time.sleep(0.002)
        elif how != "timeout":
            proc.send_signal({"sigterm": signal.SIGTERM, "sighup": signal.SIGHUP}.get(how, signal.SIGINT))
        out = _finish(proc, job, lines)
        expected = {"timeout": 124, "sigterm": 143, "sigterm again and again": 143,
                    "sighup": 129}.get(how, 130)
        assert proc.returncode == expected, lines + out
        left = [p for p in launch.tagged(job.tag) if p != os.getpid()]
        assert not left, f"processes of the job left running: {left}"
        assert not job.leftovers(), f"the job's files were left (it made {made})"


FAILING = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    from mpi4py import MPI
    import pycoll

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    how, go = sys.argv[1:]
    c = MPI.COMM_WORLD
    team = pycoll.Team.from_mpi(c)  # (from now on an uncaught exception aborts the job)
    b = np.empty(1000)
    c.Allreduce(np.ones(1000), b)  # (MPICH's shared memory, made in MPI_Init)
    peer = c.allgather(os.getpid())[1 - c.rank]
    print(f"UP {c.rank}", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    if c.rank == 1:
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "exit 3":
            os._exit(3)
        raise RuntimeError("rank 1 fails")
    # mpiexec kills rank 0 once rank 1 is gone; not always after a plain exit (Hydra's proxy may
    # reap rank 1 before it sees its PMI socket close, and then kills nobody): rank 0 then leaves
    # too, without finalizing, as one whose peer died would
    while alive(peer):
        time.sleep(0.01)
    time.sleep(2)
    os._exit(0)
""")
#: the status ``pycoll run`` gives (mpiexec's): the signal's number, MPI_Abort's code, the exit's;
#: or SIGKILL's, of the rank it killed then, where it reaped that one first
FAILED = {"sigkill": 9, "abort": 1, "exit 3": 3}


@pytest.mark.parametrize("how", list(FAILED))
def test_run_removes_what_a_failed_job_left(how, tmp_path):
    """A rank killed (SIGKILL), an uncaught exception (the job aborts: PYCOLL_ABORT_ON_ERROR) or a
    rank's exit with status 3, while the other rank waits: the job ends (mpiexec kills the other
    rank) and leaves MPICH's shared memory behind (the last rank to finalize removes it, and none
    does); ``pycoll run`` exits with mpiexec's status and removes it. The segment is the one
    ``pycoll.leftovers`` named beforehand from the job's mpiexec."""
    script, go = tmp_path / "failing.py", tmp_path / "go"
    script.write_text(FAILING)
    with launched(f"pycoll run ({how})") as job:
        proc = _pycoll_run(job, 2, script, how, str(go))
        lines = read_until(proc, "UP", 2, 60, f"pycoll run ({how})")
        made = job.files.present()
        # the segment its ranks map is the one MPICH's naming foretold (what is found even when
        # the job ends before anyone looks)
        assert _mpich_shm(made) == sorted(job.files.named()), (made, job.files.named())
        go.touch()
        out = _finish(proc, job, lines)
        assert proc.returncode in (FAILED[how], 9), lines + out
        assert not job.leftovers(), f"the job's files were left (it made {made})\n{lines + out}"


def test_run_beside_other_jobs_counts_and_removes_only_its_own(tmp_path):
    """Beside a ``pycoll run`` job whose rank is killed (its shared memory must go): a foreign
    ``mpich_shm_*`` file that nobody maps (as a killed foreign job leaves one), made by the test
    while the job runs, and a real MPI job of two ranks started meanwhile. ``pycoll run`` and the
    launch's leftover check remove and count the job's own file only: the foreign file and the
    other job's files are still there and counted by neither."""
    script, go = tmp_path / "failing.py", tmp_path / "go"
    script.write_text(FAILING)
    foreign = f"/dev/shm/mpich_shm_{secrets.token_hex(4)}_0"
    sleeper = ("import time; from mpi4py import MPI; print(f'UP {MPI.COMM_WORLD.rank}', flush=True); "
               "time.sleep(120)")
    try:
        with launched("pycoll run beside another job") as job:
            proc = _pycoll_run(job, 2, script, "sigkill", str(go))
            lines = read_until(proc, "UP", 2, 60, "pycoll run")
            with launched("another MPI job beside") as other:
                beside = subprocess.Popen([launch.mpiexec(), "-n", "2", sys.executable, "-c", sleeper],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          env={**child_env(), **other}, start_new_session=True)
                read_until(beside, "UP", 2, 60, "the MPI job beside")
                theirs = other.files.present()
                assert _mpich_shm(theirs), theirs
                fd = os.open(foreign, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                os.write(fd, bytes(4096))
                os.close(fd)
                mine = job.files.present()
                assert _mpich_shm(mine) and not {foreign, *theirs} & set(mine), (mine, theirs)
                go.touch()
                out = _finish(proc, job, lines)
                assert proc.returncode == FAILED["sigkill"], lines + out
                assert not job.leftovers(), "its own shared memory was left, or others' counted"
                assert os.path.exists(foreign), "pycoll run removed a file not its job's"
                assert all(map(os.path.exists, theirs)), "pycoll run removed the other job's files"
                launch.kill_tagged(other.tag)
                beside.communicate()
            assert os.path.exists(foreign), "the other job's launch removed a file not its own"
        assert os.path.exists(foreign), "the launch removed a file not its own"
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(foreign)
