"""The command line: info, run and perf (launching real ranks)."""

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pycoll.launch import HYDRA_TOPOLOGY
from tests import launch
from tests.launch import ROOT, child_env, launched, shm_entries


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


@pytest.mark.parametrize("how", ["timeout", "ctrl-c", "ctrl-c ignored", "sigterm"])
def test_run_ends_its_ranks_and_leaves_no_shared_memory(how, tmp_path):
    """``pycoll run`` ended by ``--timeout``, Ctrl-C (SIGINT) or SIGTERM (an outer ``timeout``), with
    ranks that are inside MPI (MPICH's shared memory mapped) and may ignore SIGINT: every rank ends
    (SIGINT, then SIGKILL), the status is 124, 130 or 143, and MPICH's files in /dev/shm are removed."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent(f"""
        import signal, time
        import numpy as np
        from mpi4py import MPI
        c = MPI.COMM_WORLD
        b = np.empty(1000)
        c.Allreduce(np.ones(1000), b)
        if {how in ("ctrl-c ignored", "sigterm")!r}:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("UP", c.rank, flush=True)
        time.sleep(120)
    """))
    before = set(shm_entries("mpich"))
    topology = set(glob.glob(HYDRA_TOPOLOGY + "*"))  # (the launcher's, held by its proxy)
    with launched(f"pycoll run ({how})") as tag:
        argv = [sys.executable, "-m", "pycoll.cli", "run", "-n", "2",
                "--timeout", "4" if how == "timeout" else "100", "--", sys.executable, str(script)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**child_env(), **tag}, cwd=str(ROOT))
        lines = []
        t0 = time.monotonic()
        while "".join(lines).count("UP") < 2 and time.monotonic() - t0 < 60:  # (lines may interleave)
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        if how != "timeout":
            proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        if how == "sigterm":  # a second one while the ranks end (they ignore SIGINT: 2 s) is ignored
            time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        expected = {"timeout": 124, "sigterm": 143}.get(how, 130)
        assert proc.returncode == expected, "".join(lines) + out
        time.sleep(0.2)
        left = [p for p in launch.tagged(tag[launch.LAUNCH_VAR]) if p != os.getpid()]
        assert not left, f"processes of the job left running: {left}"
        assert set(shm_entries("mpich")) <= before, "MPICH's shared memory left in /dev/shm"
        assert set(glob.glob(HYDRA_TOPOLOGY + "*")) <= topology, "Hydra's topology file left"
