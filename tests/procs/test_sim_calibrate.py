"""``pycoll sim calibrate`` measures this host on 2 ranks and writes a machine file the simulator
loads; the simulated 8 B allreduce (recursive doubling, one step) is then the measured alpha."""

import pytest

from pycoll.sim import Machine, load, programs, run


def test_calibrate_writes_a_machine_file_the_simulator_runs(cli, tmp_path):
    """The rates and latencies by size, measured through the pair's collectives (the default), and
    the plain model (``--plain``): each loads, and an 8 B allreduce simulates as its model says."""
    out, plain = tmp_path / "host.toml", tmp_path / "plain.toml"
    for path, extra in ((out, ()), (plain, ("--plain",))):
        rc, text, err = cli("sim", "calibrate", "--out", str(path), "--steps", "200", "--repeats", "2",
                            *extra, timeout=120)
        assert rc == 0, text + err
    m = load(str(out))
    assert isinstance(m, Machine) and m.ppn == 2 and m.cpu_copies, out.read_text()
    assert len(m.node_bandwidth_by_size) == 8 and len(m.reduce_by_size) == 8 and m.node_alpha_by_size
    # (measured times: positive and finite, well below a second, however busy the machine is)
    assert 0 < m.overhead < 1 and 0 <= m.call < 1 and 0 <= m.alpha < 1, out.read_text()
    assert all(f >= 1 for _, f in m.together_by_size), out.read_text()
    # one step: each rank posts its send and its receive (an overhead each); the peer's message is
    # there alpha after its send was posted, then this rank's core copies it in and reduces (the two
    # ranks copy at once: without the factor a loaded machine may measure for that, 1.0-1.3 at 4 KiB)
    m.together_by_size = ()
    o, (alpha, per_byte) = m.overhead, m.message(0, 1, 8)
    assert run(programs("allreduce", "rd", 2, 8), m).time == pytest.approx(
        max(o + alpha, 2 * o) + 8 * per_byte + m.compute(True, 8), rel=1e-6)
    m = load(str(plain))
    assert not m.by_size and 0 < m.alpha < 1 and m.node_alpha == m.alpha  # (Python's message cost)
    assert m.bandwidth > 1e8 and m.reduce_bw > 1e8 and m.copy_bw > 1e8, plain.read_text()
    assert run(programs("allreduce", "rd", 2, 8), m).time == pytest.approx(m.alpha + 8 / m.bandwidth
                                                                          + 8 / m.reduce_bw, rel=1e-6)


def _calibrated_across(hosts, per_host, out, steps):
    """Calibrate ``per_host`` ranks on two network namespaces (UCX over TCP) into ``out``: the
    file's text and its machine."""
    from tests.launch import need_ucx

    need_ucx()
    hosts("tests/procs/scripts/calibrate_hosts.py", per_host, str(out), "--steps", steps, "--repeats", "2",
          timeout=150, env={"PYCOLL_TLS": "ucx", "UCX_TLS": "tcp"})
    return out.read_text(), load(str(out))


def test_calibrate_across_two_hosts_measures_the_network_and_the_node_apart(hosts, tmp_path):
    """2 + 2 ranks in two network namespaces (UCX over TCP): the network's parameters come from rank
    0 and a rank of the other host, the node's from the two ranks of rank 0's; ppn is 2."""
    text, m = _calibrated_across(hosts, [2, 2], tmp_path / "hosts.toml", "100")
    assert "4 ranks on 2 nodes (2 on rank 0's)" in text, text
    assert m.ppn == 2 and 0 < m.alpha < 1 and 0 < m.node_alpha < 1, text
    assert m.bandwidth > 1e6 and m.node_bandwidth > 1e6, text
    assert (m.alpha, m.bandwidth) != (m.node_alpha, m.node_bandwidth), text  # (two pairs measured)


def test_the_fit_across_two_hosts_calibrates_times_and_simulates_one_rank_a_host():
    """``benchmarks/sim_accuracy.py --hosts``: 1 + 1 ranks in two network namespaces (UCX over
    TCP) calibrate the measured model across the hosts, time the collective as ``pycoll perf``
    does, and the simulation of each size is printed beside the measured time."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.launch import need_ucx, netns_unavailable

    need_ucx()
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "benchmarks/sim_accuracy.py", "--hosts", "-n", "2", "--cases",
                          "allreduce:rd,bcast:knomial", "--min-bytes", "4K", "--max-bytes", "16K",
                          "--steps", "200", "--repeats", "2"],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines()
            if line.split()[:1] in (["allreduce"], ["bcast"])]
    assert [(r[0], int(r[2])) for r in rows] == [("allreduce", 4096), ("allreduce", 16384), ("bcast", 4096),
                                                 ("bcast", 16384)], out.stdout
    assert all(float(r[3]) > 0 and float(r[5]) > 0 for r in rows), out.stdout
    assert "two hosts" in out.stdout and "all: " in out.stdout and "of 4 within 25%" in out.stdout, out.stdout


def test_a_pair_on_two_hosts_calibrates_the_measured_model_of_the_network(hosts, tmp_path):
    """1 + 1 ranks in two network namespaces (UCX over TCP): the network gets the pair's rates and
    latencies by size, no node copies, and how much longer its messages take both ways at once
    than one way (``half_duplex`` where 1.5x or more), and the file loads."""
    from pycoll.sim.calibrate import HALF_DUPLEX

    text, m = _calibrated_across(hosts, [1, 1], tmp_path / "pair.toml", "200")
    assert "2 ranks on 2 nodes (1 on rank 0's)" in text and m.ppn == 1, text
    assert len(m.bandwidth_by_size) == 8 and m.alpha_by_size and not m.cpu_copies, text
    ratio = float(text.split("both ways at once: ")[1].split("x")[0])
    assert 0.3 < ratio < 10 and m.half_duplex == (ratio >= HALF_DUPLEX), text
