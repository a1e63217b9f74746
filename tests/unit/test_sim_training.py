"""pycoll sim train: ByteScheduler's scheduling model in simulated time. The note's three-layer
example (compute 1 unit per pass, gradients of 1, 1 and 3 units) takes 9 units a step FIFO and 7
by priority in parts of 1 unit; VGG16 on 64 workers with compute close to communication: FIFO
slower than priority, which reaches the ideal bound; the CLI prints the three."""

import pytest

from pycoll.cli import main as cli
from pycoll.sim import Machine
from pycoll.sim.training import Layer, ideal, reduce_time, step_time, vgg16


def test_the_notes_example():
    layers = [Layer(f"l{i}", units, 1.0, 1.0) for i, units in enumerate((1, 1, 3))]
    units = float  # (a message of n bytes takes n units)
    assert step_time(layers, units, "fifo") == 9.0
    assert step_time(layers, units, "priority", 1) == 7.0
    assert ideal(layers, units, 1) == 6.0  # (the compute of a step)


def test_vgg16_at_64_workers_priority_reaches_the_ideal():
    layers = vgg16(0.25)
    assert sum(layer.nbytes for layer in layers) == 4 * 138_357_544
    comm = reduce_time(Machine(alpha=5e-6, bandwidth=1.25e9, ppn=8, reduce_bw=20e9), 64, "rabenseifner")
    fifo, prio = step_time(layers, comm, "fifo"), step_time(layers, comm, "priority", 4 << 20)
    best = ideal(layers, comm, 4 << 20)
    assert fifo > 1.2 * prio and prio == pytest.approx(best, rel=0.01)


def test_the_cli(capsys):
    assert cli(["sim", "train", "-n", "64", "--ppn", "8", "--bandwidth", "10Gbit/s", "--alpha", "5us",
                "--reduce", "20GB/s"]) == 0
    rows = {line.split()[0]: float(line.split()[-2]) for line in capsys.readouterr().out.splitlines()
            if line.split()[:1] in (["fifo"], ["priority"], ["ideal"])}
    assert rows["fifo"] > rows["priority"] >= rows["ideal"] * 0.999


def test_a_credit_overlaps_the_small_parts_latencies():
    """In parts of 256 KiB one at a time, each part pays its allreduce's fixed costs; with a credit
    of 4 MiB in flight they overlap (ByteScheduler's credit): the step is shorter, and reaches the
    ideal bound with overlapped latencies; a credit of one part is about one at a time (a layer's
    last, smaller part may join the one in flight)."""
    layers = vgg16(0.25)
    comm = reduce_time(Machine(alpha=5e-6, bandwidth=1.25e9, ppn=8, reduce_bw=20e9), 64, "rabenseifner")
    one = step_time(layers, comm, "priority", 256 << 10)
    assert step_time(layers, comm, "priority", 256 << 10, credit=256 << 10) == pytest.approx(one, rel=1e-3)
    credited = step_time(layers, comm, "priority", 256 << 10, credit=4 << 20)
    assert credited < 0.95 * one
    assert credited == pytest.approx(ideal(layers, comm, 256 << 10, 4 << 20), rel=0.01)
    assert ideal(layers, comm, 256 << 10, 4 << 20) < ideal(layers, comm, 256 << 10)


def test_push_pull_through_few_servers_is_the_servers_bandwidth():
    """BytePS's push-sum-pull as programs (workers push a part to every server, servers sum and send
    back): through k servers that are the bottleneck, a 64 MiB tensor of n workers takes the
    servers' traffic 2nM/k over their link (within 5%; OSDI'20 section 4.1); more servers are never
    slower; and ``pycoll sim train --servers`` schedules through it."""
    from pycoll.sim.training import push_pull_time

    m = Machine(alpha=5e-6, bandwidth=1.25e9, ppn=8, reduce_bw=20e9)
    size, n = 64 << 20, 64
    times = [push_pull_time(m, n, k)(size) for k in (1, 4, 16, 64)]
    for k, t in zip((1, 4), times):
        assert t == pytest.approx(2 * n * size / (k * 1.25e9), rel=0.05), (k, t)
    assert times == sorted(times, reverse=True)
    assert times[-1] >= 2 * size / 1.25e9  # (a worker's own traffic: it pushes and pulls the whole)


def test_the_cli_with_servers(capsys):
    assert cli(["sim", "train", "-n", "16", "--ppn", "8", "--bandwidth", "10Gbit/s", "--servers", "4"]) == 0
    out = capsys.readouterr().out
    assert "push-sum-pull through 4 servers" in out, out
