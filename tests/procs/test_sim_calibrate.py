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
