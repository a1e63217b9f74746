"""``pycoll perf push_pull`` and push_pull's traffic per role on real ranks against BytePS's formula
(OSDI'20, section 4.1): a worker sends and receives ``M + (n-2)*M_gpu`` bytes per iteration, a
server ``n*M_cpu``, with ``M_gpu = (n-k)M/(n^2+kn-2k)`` and ``M_cpu = 2(n-1)M/(n^2+kn-2k)``. The
formula itself: tests/unit/test_push_pull_perf.py."""

import json
import sys

from tests.launch import child_env, mpiexec

TOLERANCE = 0.05


def traffic_lines(out):
    """{role: (sent, received, formula, sent/formula, received/formula)} from the traffic table."""
    rows = {}
    for line in out.splitlines():
        words = line.split()
        if words[:2] in (["#", "worker"], ["#", "server"]):
            rows[words[1]] = tuple(float(w) for w in words[2:])
    return rows


def test_perf_push_pull_with_a_server_at_64m(tmp_path, cli):
    """pycoll perf starts the server itself; the traffic of the largest size is BytePS's."""
    out_json = tmp_path / "pp.json"
    rc, out, err = cli("perf", "push_pull", "-n", "2", "--servers", "1", "--min-bytes", "64M",
                       "--max-bytes", "64M", "--iters", "2", "--warmup", "1", "--check", "--compare",
                       "mpi", "--json", str(out_json), "--timeout", "100", timeout=120)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "# pycoll perf push_pull: 2 workers, 1 server, float32, op sum" in out
    table = [line.split() for line in out.splitlines() if line[:1] == " " and line.split()[0].isdigit()]
    assert [int(r[1]) for r in table] == [64 << 20] and table[0][-1] == "ok"
    rows = traffic_lines(out)
    assert set(rows) == {"worker", "server"}, out
    for role, (sent, recv, formula, *_) in rows.items():
        assert formula == 64 << 20  # n = 2: M for either role, whatever k
        assert abs(sent / formula - 1) <= TOLERANCE and abs(recv / formula - 1) <= TOLERANCE, (role, out)
    traffic = json.loads(out_json.read_text())["meta"]["traffic"]
    assert traffic["iters"] == 2 and traffic["workers"] == 2 and traffic["servers"] == 1
    for role in ("worker", "server"):
        r = traffic[role]
        assert abs(r["sent"] / r["formula"] - 1) <= TOLERANCE, (role, traffic)
        assert abs(r["received"] / r["formula"] - 1) <= TOLERANCE, (role, traffic)


def test_perf_push_pull_under_a_launch_with_servers(run_cmd):
    """Every rank runs pycoll perf with PYCOLL_NUM_SERVERS=2: the last two serve inside
    Team.from_mpi and leave quietly; the workers print one table and compare with MPI among
    themselves."""
    cmd = [mpiexec(), "-n", "4", sys.executable, "-m", "pycoll.cli", "perf", "push_pull",
           "--min-bytes", "256K", "--max-bytes", "1M", "--iters", "3", "--check", "--compare", "mpi"]
    env = child_env({"PYCOLL_NUM_SERVERS": "2", "PYCOLL_TIMEOUT": "50"})
    rc, out, err = run_cmd(cmd, timeout=60, env=env, what="pycoll perf push_pull under mpiexec")
    assert rc == 0, out[-3000:] + err[-3000:]
    assert out.count("# pycoll perf push_pull:") == 1 and "2 workers, 2 servers" in out, out
    table = [line.split() for line in out.splitlines() if line[:1] == " " and line.split()[0].isdigit()]
    assert [int(r[1]) for r in table] == [256 << 10, 512 << 10, 1 << 20] and all(r[-1] == "ok" for r in table)
    rows = traffic_lines(out)
    assert rows["worker"][2] == rows["server"][2] == 1 << 20  # k = n = 2: M for either role
    for role, (sent, recv, formula, *_) in rows.items():
        assert abs(sent / formula - 1) <= TOLERANCE and abs(recv / formula - 1) <= TOLERANCE, (role, out)


def test_traffic_per_role_matches_bytepss_formula(mpirun):
    """Seven (n, k) configurations at 64 MiB float32 in one launch of 8 ranks: (4, 4) on COMM_WORLD
    with PYCOLL_NUM_SERVERS=4, then (4, 2) beside (2, 0), (4, 1) beside (2, 1), (4, 0) beside
    (3, 1) on sub-communicators; each worker and server within 5% of the formula (the ranks check)."""
    out = mpirun(8, "tests/procs/scripts/push_pull_traffic.py", "4:4", "4:2,2:0", "4:1,2:1", "4:0,3:1",
                 timeout=150, env={"PYCOLL_NUM_SERVERS": "4"})
    report = sorted(line for line in out.splitlines() if line.startswith("TRAFFIC n=") and " M=" in line)
    assert len(report) == 7, out
    print("\n".join(report))
