"""``pycoll perf`` on the command line: its help, argument errors before any rank starts, and real
two-rank runs of every collective checked against numpy for pycoll and MPI. In process:
tests/unit/test_perf.py."""

import json
import sys

from pycoll import perf


def test_help_lists_every_collective_with_its_factor(cli):
    rc, out, _ = cli("perf", "--help")
    assert rc == 0
    for coll in perf.COLLECTIVES:
        line = next(x for x in out.splitlines() if x.split()[:1] == [coll])
        assert perf.COLLS[coll].factor in line and perf.COLLS[coll].mpi in line


def test_argument_errors_stop_before_ranks_start(cli):
    rc, out, err = cli("perf", "scatterv", "-n", "2", "--op", "max", "--compare", "mpi", timeout=30)
    assert rc == 2 and "pycoll perf: --op: scatterv does not reduce" in err
    rc, out, err = cli("perf", "reduce", "-n", "2", "--root", "5", timeout=30)
    assert rc == 2 and "--root 5 is not a rank of 2" in err


def _rows(data):
    rows = {}
    for row in data["rows"]:
        rows.setdefault(row["coll"], []).append(row)
    return rows


def test_every_collective_checked_against_numpy_and_mpi(tmp_path, cli):
    out_json = tmp_path / "perf.json"
    rc, out, err = cli("perf", "all", "-n", "2", "--max-bytes", "4K", "--iters", "5", "--check",
                       "--compare", "mpi", "--json", str(out_json), timeout=120)
    assert rc == 0, out[-3000:] + err[-3000:]
    data = json.loads(out_json.read_text())
    rows = _rows(data)
    assert list(rows) == list(perf.COLLECTIVES)
    assert data["meta"]["ranks"] == 2 and data["meta"]["colls"]["gather"]["root"] == 0
    for coll, got in rows.items():
        spec = perf.COLLS[coll]
        assert f"# pycoll perf {coll}: 2 ranks" in out
        assert all(r["check"] == "ok" and r["mpi_check"] == "ok" for r in got), coll
        assert all(r["avg_us"] > 0 and r["mpi_us"] > 0 for r in got), coll
        if spec.factor == "-":
            assert [(r["bytes"], r["algbw"], r["busbw"]) for r in got] == [(0, None, None)]
            continue
        assert [r["bytes"] for r in got] == [8 << i for i in range(10)], coll  # 2 ranks: sizes as given
        factor = spec.bus_factor(2)
        assert all(abs(r["busbw"] - r["algbw"] * factor) < 1e-12 for r in got), coll
        assert all(abs(r["algbw"] - r["bytes"] / r["avg_us"] / 1e3) < 1e-9 for r in got), coll
    assert "busbw = algbw * (n-1)/n = algbw * 0.500" in out and "busbw = algbw * 2(n-1)/n" in out
    table = [line.split() for line in out.splitlines() if line[:1] == " " and line.split()[0].isdigit()]
    assert len(table) == len(data["rows"]) and all(r[-1] == "ok" for r in table)


def test_rooted_collectives_at_another_root_and_other_type(cli):
    rc, out, err = cli("perf", "bcast", "reduce", "gather", "gatherv", "scatter", "scatterv", "-n", "2",
                       "--root", "1", "--dtype", "int32", "--op", "max", "--max-bytes", "64", "--iters",
                       "3", "--check", "--compare", "mpi", timeout=90)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "2 ranks, int32, op max, algorithm auto, root 1" in out
    assert "2 ranks, int32, algorithm auto, root 1" in out
    table = [line.split() for line in out.splitlines() if line[:1] == " " and line.split()[0].isdigit()]
    assert len(table) == 6 * 4 and all(r[-1] == "ok" for r in table)


def test_check_catches_a_wrong_result(cli):
    # a bcast that moves nothing: the non-root ranks keep zeros, --check must say so and fail
    code = ("import sys; from pycoll.team import Team; from pycoll import cli; "
            "Team.bcast = lambda self, buf, root=0, **kw: self.barrier(); "
            "sys.exit(cli.main(['perf', 'bcast', '--max-bytes', '16', '--iters', '2', '--check', "
            "'--compare', 'mpi']))")
    rc, out, err = cli("run", "-n", "2", "--timeout", "60", "--", sys.executable, "-c", code, timeout=90)
    assert rc != 0
    table = [line.split() for line in out.splitlines() if line[:1] == " " and line.split()[0].isdigit()]
    assert len(table) == 2 and all(r[-1] == "WRONG" for r in table)  # pycoll wrong, MPI right


def test_a_type_mpi_rejects_is_a_clear_error(cli):
    rc, out, err = cli("perf", "allreduce", "-n", "2", "--dtype", "bool", "--op", "max", "--compare",
                       "mpi", "--max-bytes", "16", "--iters", "2", timeout=60)
    assert rc == 2 and "MPI's Allreduce rejects bool with op max" in err and "without --compare mpi" in err


def test_plot_draws_one_picture_per_collective(tmp_path, cli):
    out = tmp_path / "perf.png"
    rc, text, err = cli("perf", "allreduce", "barrier", "-n", "2", "--compare", "mpi", "--max-bytes", "1K",
                        "--iters", "20", "--plot", str(out), timeout=180)
    assert rc == 0, err
    for coll in ("allreduce", "barrier"):
        png = tmp_path / f"perf_{coll}.png"
        assert f"# plot: {png}" in text
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_algorithm_all_runs_each_usable_algorithm(tmp_path, cli):
    """``--algorithm all``: a table per algorithm that can run here (shm and the single copy on one
    host, no hierarchical ones on one node), every size checked, rows saying their algorithm."""
    out = tmp_path / "all.json"
    rc, text, err = cli("perf", "bcast", "-n", "2", "--algorithm", "all", "--max-bytes", "64", "--iters",
                        "5", "--check", "--json", str(out), timeout=180)
    assert rc == 0, err
    import json

    rows = json.loads(out.read_text())["rows"]
    ran = list(dict.fromkeys(r["algorithm"] for r in rows))
    assert ran == ["auto", "cma", "knomial", "scatter_allgather", "shm"], ran
    assert all(r["check"] == "ok" for r in rows)
    assert text.count("# pycoll perf bcast") == 5 and "algorithm hier" not in text


def test_alloc_buffers_take_the_mapped_allreduce(tmp_path, cli):
    """``--alloc``: buffers from team.alloc for pycoll and MPI alike (the root-only ones too:
    every rank allocates); the allreduce takes the mapped form, only there; every size checked."""
    out = tmp_path / "alloc.json"
    rc, text, err = cli("perf", "allreduce", "gather", "-n", "2", "--alloc", "--algorithm", "all",
                        "--max-bytes", "4K", "--iters", "3", "--check", "--compare", "mpi", "--json",
                        str(out), timeout=180)
    assert rc == 0, err
    import json

    rows = json.loads(out.read_text())["rows"]
    ran = {(r["coll"], r["algorithm"]) for r in rows}
    assert ("allreduce", "mapped") in ran and not any(a == "mapped" for c, a in ran if c == "gather"), ran
    assert all(r["check"] == "ok" for r in rows)


def test_several_rank_counts_print_one_scaling_table(tmp_path, cli):
    out_json, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    rc, out, err = cli("perf", "allreduce", "gather", "-n", "1,3", "--max-bytes", "64", "--iters", "5",
                       "--check", "--compare", "mpi", "--json", str(out_json), "--plot", str(png),
                       timeout=180)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "# pycoll perf: 1 ranks" in out and "# pycoll perf: 3 ranks" in out
    table = out[out.index("# scaling"):].splitlines()
    assert table[1].split()[-2:] == ["n=1", "n=3"]
    gather_64 = next(line.split() for line in table if line.split()[:3] == ["gather", "auto", "64"])
    assert float(gather_64[3]) > 0 and gather_64[4] == "-"  # 64 B is no gather size on 3 ranks
    rows = json.loads(out_json.read_text())["rows"]
    assert {r["ranks"] for r in rows} == {1, 3} and all(r["check"] == "ok" for r in rows if "check" in r)
    assert png.stat().st_size > 10_000
    rc, out, err = cli("perf", "allreduce", "-n", "2,x", timeout=30)
    assert rc == 2 and "rank counts are integers" in err
