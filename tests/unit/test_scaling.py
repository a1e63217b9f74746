"""The rank sweep of ``pycoll perf -n 2,4,8``: parsing, the options it sets per launch, the table."""

import pytest

from pycoll import scaling


def test_rank_counts():
    assert scaling.rank_counts("4") == [4]
    assert scaling.rank_counts("2,4,8,16") == [2, 4, 8, 16]
    for bad in ("", "2,x", "0,2"):
        with pytest.raises(ValueError):
            scaling.rank_counts(bad)


def test_each_launch_gets_its_own_rank_count_results_and_no_picture():
    argv = ["allreduce", "-n", "2,4", "--compare", "mpi", "--json=a.json", "--plot", "p.png", "-n8",
            "--max-bytes", "4K"]
    assert scaling.without_own_options(argv) == ["allreduce", "--compare", "mpi", "--max-bytes", "4K"]


def test_a_sweep_collects_every_launch_and_tabulates_by_rank_count(tmp_path):
    import json

    seen = []

    def launch_one(n, argv):
        seen.append((n, argv))
        out = argv[argv.index("--json") + 1]
        rows = [{"coll": "bcast", "algorithm": "auto", "bytes": 8, "avg_us": 1.0, "vs_mpi": 0.5 * n}]
        if n == 4:
            rows.append({"coll": "bcast", "algorithm": "auto", "bytes": 16, "avg_us": 2.0})
        with open(out, "w") as f:
            json.dump({"meta": {}, "rows": rows}, f)
        return 0 if n == 2 else 1

    status, rows = scaling.sweep(["bcast", "-n", "2,4"], [2, 4], launch_one)
    assert status == 1 and [n for n, _ in seen] == [2, 4]
    assert seen[1][1][:3] == ["bcast", "-n", "4"]
    assert [r["ranks"] for r in rows] == [2, 4, 4]
    lines = scaling.table(rows, [2, 4]).splitlines()
    assert lines[2].split() == ["bcast", "auto", "8", "1.00", "2.00"]
    assert lines[3].split() == ["bcast", "auto", "16", "-", "-"]


@pytest.mark.parametrize("status", [130, 143])
def test_an_interrupted_launch_ends_the_sweep(status):
    seen = []

    def launch_one(n, argv):
        seen.append(n)
        return status

    assert scaling.sweep(["bcast"], [2, 4, 8], launch_one) == (status, [])
    assert seen == [2]


def test_auto_binding_counts_whole_cores_and_only_with_every_cpu():
    """bind=auto pins ranks to cores only where this process may use every CPU (mpiexec would pin
    outside a taskset's share) and counts a core's hardware threads once."""
    import os
    import subprocess
    import sys

    from pycoll.launch import pinnable_cores

    cpus = os.sched_getaffinity(0)
    if len(cpus) < (os.cpu_count() or 0):
        assert pinnable_cores() == 0
        return
    assert 1 <= pinnable_cores() <= len(cpus)
    if len(cpus) >= 2:
        code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
                "from pycoll.launch import pinnable_cores; print(pinnable_cores())")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "0", out.stderr
