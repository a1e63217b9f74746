"""pycoll.sim with a rank that dies: the survivors that need it raise PeerLostError at the simulated
time the detection settings imply; those that do not need it finish; the CLI says both. And what a
simulated run writes besides its table: its timeline (--trace) and its plot (--plot)."""

import json

import pytest

from pycoll.cli import main as cli
from pycoll.sim import Machine, programs, run

M = Machine(alpha=2e-6, bandwidth=10e9, reduce_bw=5e9)


def test_the_root_of_a_bcast_dies_before_it_sends():
    """Every other rank waits on it: each raises at the death plus the detection time."""
    res = run(programs("bcast", "knomial", 16, 1 << 20), M, fail={0: (0.0, 0.05)})
    assert res.died == {0: 0.0}
    assert res.errors == {r: pytest.approx(0.05) for r in range(1, 16)}
    assert res.time == pytest.approx(0.05) and not res.unmatched


def test_a_leaf_that_dies_stops_nobody():
    """The last rank of a k-nomial bcast from 0 sends nothing: the others finish when they did."""
    progs = programs("bcast", "knomial", 16, 1 << 20)
    res, base = run(progs, M, fail={15: (0.0, 0.05)}), run(progs, M)
    assert not res.errors and res.finish[:15] == pytest.approx(base.finish[:15])


def test_a_death_mid_allreduce_is_known_after_the_detection_time():
    """Rank 3 of recursive doubling dies during its second step: its last partner (rank 7) raises
    once it is stuck and the death is known (death + 50 ms here, long after it got stuck); the
    node-silence delay (1.5 s) applies the same way."""
    progs = programs("allreduce", "rd", 8, 1 << 20)
    half = run(progs, M).time / 2
    res = run(progs, M, fail={3: (half, 0.05)})
    assert 7 in res.errors and res.errors[7] == pytest.approx(half + 0.05)
    assert all(t == pytest.approx(half + 0.05) for t in res.errors.values())
    res = run(progs, M, fail={3: (half, 1.5)})
    assert res.errors[7] == pytest.approx(half + 1.5)


def test_the_cli_kills_a_rank_and_a_node(capsys):
    assert cli(["sim", "bcast", "-n", "16", "--algorithm", "knomial", "--min-bytes", "1M", "--max-bytes",
                "1M", "--kill", "0:0"]) == 0
    assert "died (us): rank 0 at 0.0; PeerLostError on 15 survivors at 50000.0-50000.0 us; 0 finished" in \
        capsys.readouterr().out
    assert cli(["sim", "allreduce", "-n", "16", "--ppn", "4", "--algorithm", "rd", "--min-bytes", "1M",
                "--max-bytes", "1M", "--kill-node", "1:0"]) == 0
    out = capsys.readouterr().out
    assert "rank 4 at 0.0, 5 at 0.0, 6 at 0.0, 7 at 0.0;" in out and "1500000.0" in out
    assert cli(["sim", "bcast", "-n", "16", "--kill", "16:0"]) == 2


def test_the_timeline_of_a_simulated_run(tmp_path, capsys):
    """--trace: every instruction of every rank, issued to done, in the trace format; recursive
    doubling on 4 ranks: each rank sends and receives twice and reduces twice, the last reduction
    ending when the simulation does."""
    path = tmp_path / "sim.json"
    assert cli(["sim", "allreduce", "-n", "4", "--algorithm", "rd", "--min-bytes", "1M", "--max-bytes", "1M",
                "--trace", str(path)]) == 0
    time_us = float(next(line.split()[2] for line in capsys.readouterr().out.splitlines()
                         if line.split()[:1] == ["rd"]))
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    for rank in range(4):
        names = sorted(e["name"].split()[0] for e in spans if e["pid"] == rank)
        assert names == ["recv", "recv", "reduce", "reduce", "send", "send"], names
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(time_us, abs=0.01)  # (printed to 0.01)
    assert all(e["dur"] >= 0 for e in spans)


def test_the_plot_of_a_simulated_run(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sim.png"
    assert cli(["sim", "allreduce", "-n", "16", "--algorithm", "rd,ring", "--min-bytes", "8", "--max-bytes",
                "64K", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
