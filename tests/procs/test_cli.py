"""The command line: info, run and perf (launching real ranks)."""

import json
import os
import sys


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
    for word in ("mpi", "local", "tcp", "knomial, rab, rd, ring, shm"):
        assert word in out
    for name in SETTINGS:
        assert name in out
    assert "chosen for" not in out
    rc, out, _ = cli("info", "-n", "16")
    assert rc == 0 and "chosen for 16 ranks on one host" in out
    assert "  alltoall        1-64K shm, 128K-128M cma" in out


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


def test_perf_other_dtype_algorithm_and_ranks(cli):
    rc, out, err = cli("perf", "allreduce", "-n", "3", "--max-bytes", "4K", "--dtype", "bfloat16",
                       "--op", "max", "--algorithm", "knomial", "--iters", "5", "--check")
    assert rc == 0, err
    assert "3 ranks, bfloat16, op max, algorithm knomial" in out
    rc, out, err = cli("perf", "allreduce", "-n", "2", "--op", "band", "--max-bytes", "64")
    assert rc != 0 and "BAND is not defined for float32" in out + err
