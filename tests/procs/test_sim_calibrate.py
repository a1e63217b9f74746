"""``pycoll sim calibrate`` measures this host on 2 ranks and writes a machine file the simulator
loads; the simulated 8 B allreduce (recursive doubling, one step) is then the measured alpha."""

import pytest

from pycoll.sim import Machine, load, programs, run


def test_calibrate_writes_a_machine_file_the_simulator_runs(cli, tmp_path):
    out = tmp_path / "host.toml"
    rc, text, err = cli("sim", "calibrate", "--out", str(out), "--steps", "200", "--repeats", "2",
                        timeout=120)
    assert rc == 0, text + err
    m = load(str(out))
    assert isinstance(m, Machine) and m.ppn == 2
    assert 0 < m.alpha < 1e-3 and m.node_alpha == m.alpha, text  # (Python's message cost: microseconds)
    assert m.bandwidth > 1e8 and m.reduce_bw > 1e8 and m.copy_bw > 1e8, text
    assert run(programs("allreduce", "rd", 2, 8), m).time == pytest.approx(m.alpha + 8 / m.bandwidth
                                                                          + 8 / m.reduce_bw, rel=1e-6)


def test_calibrate_across_two_hosts_measures_the_network_and_the_node_apart(hosts, tmp_path):
    """2 + 2 ranks in two network namespaces (UCX over TCP): the network's parameters come from rank
    0 and a rank of the other host, the node's from the two ranks of rank 0's; ppn is 2."""
    from tests.launch import need_ucx

    need_ucx()
    out = tmp_path / "hosts.toml"
    hosts("tests/procs/scripts/calibrate_hosts.py", [2, 2], str(out), "--steps", "100", "--repeats", "2",
          timeout=150, env={"PYCOLL_TLS": "ucx", "UCX_TLS": "tcp"})
    text = out.read_text()
    m = load(str(out))
    assert "4 ranks on 2 nodes (2 on rank 0's)" in text, text
    assert m.ppn == 2 and 0 < m.alpha < 1e-2 and 0 < m.node_alpha < 1e-2, text
    assert m.bandwidth > 1e6 and m.node_bandwidth > 1e6, text
    assert (m.alpha, m.bandwidth) != (m.node_alpha, m.node_bandwidth), text  # (two pairs measured)
