"""pycoll.sim with shared links: max-min fair rates, one message as without sharing, an
oversubscribed fat tree that slows recursive doubling but not the ring (exactly as the links say),
NICs shared by a node's ranks and rails that give each its own, machine files and the CLI."""

import math

import pytest

from pycoll.cli import main as cli
from pycoll.sim import Machine, programs, run
from pycoll.sim.flows import Flows, max_min_rates
from pycoll.sim.machine import from_dict

S = 1 << 20  # bytes per message of the allreduces below (recursive doubling: the whole buffer)


def network_only(**kw) -> Machine:
    """A machine whose only costs are the network's (reductions and copies free)."""
    return Machine(alpha=2e-6, bandwidth=10e9, reduce_bw=math.inf, copy_bw=math.inf, **kw)


def test_max_min_rates():
    """Two flows on a link of 10 and one of them also on a link of 4: 4 for it, 6 for the other;
    three flows on one link share it equally; a flow on no link is unlimited."""
    cap = {"x": 10.0, "y": 4.0, "z": 9.0}.get
    assert max_min_rates({1: ["x"], 2: ["x", "y"]}, cap) == {1: 6.0, 2: 4.0}
    assert max_min_rates({1: ["z"], 2: ["z"], 3: ["z"]}, cap) == {1: 3.0, 2: 3.0, 3: 3.0}
    assert max_min_rates({1: []}, cap) == {1: math.inf}


def test_flows_drain_at_their_rates_and_speed_up_when_others_end():
    """Two flows of 10 and 30 bytes on a link of 10 B/s: both at 5 until the first ends at 2 s, the
    second then alone at 10: it ends at 4 s."""
    flows = Flows({"l": 10.0}.get)
    flows.start(0.0, 1, 10, ["l"])
    flows.start(0.0, 2, 30, ["l"])
    assert sorted(flows.settle()) == [(2.0, 1), (6.0, 2)]
    flows.end(2.0, 1)
    assert flows.settle() == [(4.0, 2)]


@pytest.mark.parametrize("alg", ["rd", "ring", "rabenseifner"])
def test_without_sharing_a_message_takes_what_it_took(alg):
    """One rank per node and a NIC each, no fat tree: no two messages share a link in these
    allreduces (pairs exchange, or each rank sends to one and hears from one), so the times are
    those of the model without contention. (A tree's parent that sends to several children at once
    does share its NIC: there the model without contention, which books a message on the sender's
    link and the receiver's together, can be slower.)"""
    progs = programs("allreduce", alg, 16, S)
    m = Machine(alpha=2e-6, bandwidth=10e9, reduce_bw=5e9)
    assert run(progs, Machine(alpha=2e-6, bandwidth=10e9, reduce_bw=5e9, contention=True)).time == \
        pytest.approx(run(progs, m).time, rel=1e-12)


def test_an_oversubscribed_fat_tree_slows_recursive_doubling_not_the_ring():
    """64 nodes, 8 per leaf, uplinks 4:1: recursive doubling's three first steps stay in a leaf,
    its three last send all 8 nodes' messages through an uplink of 8 * 10 / 4 = 20 GB/s (2.5 GB/s
    each: 4x slower); the ring crosses each uplink with one message at a time and is not slowed."""
    tree = network_only(contention=True, nodes_per_leaf=8, oversubscription=4)
    rd = run(programs("allreduce", "rd", 64, S), tree).time
    assert rd == pytest.approx(6 * 2e-6 + 3 * S / 10e9 + 3 * S / 2.5e9, rel=1e-9)
    flat_rd = run(programs("allreduce", "rd", 64, S), network_only()).time
    assert rd / flat_rd == pytest.approx(2.5, rel=0.02)  # (the latencies are not slowed)
    ring = programs("allreduce", "ring", 64, 64 * S)
    assert run(ring, tree).time == pytest.approx(run(ring, network_only()).time, rel=1e-9)


def test_a_2_to_1_fat_tree_moves_the_ring_crossover_down():
    """64 nodes, 12.5 GB/s, 2 us: at 512 KiB recursive doubling beats the ring on a non-blocking
    network and loses to it on a 2:1 fat tree of 8 nodes per leaf (closed forms: the crossover
    moves from 727 to 417 KiB; benchmarks/sim_crossover.py prints the table)."""
    base = dict(alpha=2e-6, bandwidth=12.5e9, reduce_bw=math.inf, copy_bw=math.inf)
    flat, tree = Machine(**base), Machine(**base, contention=True, nodes_per_leaf=8, oversubscription=2)
    rd, ring = programs("allreduce", "rd", 64, 512 << 10), programs("allreduce", "ring", 64, 512 << 10)
    assert run(rd, flat).time < run(ring, flat).time
    assert run(rd, tree).time > run(ring, tree).time == pytest.approx(run(ring, flat).time)


def test_a_nodes_ranks_share_its_nic_unless_it_has_one_each():
    """8 ranks per node: recursive doubling's three last steps leave the node, all 8 ranks at once:
    through one NIC each message gets an eighth of it; with 8 NICs (rails) each its own."""
    def machine(nics):
        return network_only(ppn=8, node_alpha=0.5e-6, node_bandwidth=50e9, contention=True, nics=nics)
    progs = programs("allreduce", "rd", 64, S)
    in_node = 3 * (0.5e-6 + S / 50e9)
    assert run(progs, machine(1)).time == pytest.approx(in_node + 3 * (2e-6 + 8 * S / 10e9), rel=1e-9)
    assert run(progs, machine(8)).time == pytest.approx(in_node + 3 * (2e-6 + S / 10e9), rel=1e-9)


def test_machine_files_and_the_cli(capsys):
    m = from_dict({"node": {"ppn": 4, "nics": 2}, "fabric": {"nodes_per_leaf": 16, "oversubscription": 2}})
    assert (m.contention, m.nics, m.nodes_per_leaf, m.oversubscription) == (True, 2, 16, 2.0)
    assert not from_dict({"fabric": {"contention": False}}).contention
    with pytest.raises(ValueError, match="true or false"):
        from_dict({"fabric": {"contention": "yes"}})
    with pytest.raises(ValueError, match="oversubscription"):
        from_dict({"fabric": {"oversubscription": 0}})
    assert cli(["sim", "allreduce", "-n", "64", "--algorithm", "rd,ring", "--nodes-per-leaf", "8",
                "--oversubscription", "4", "--min-bytes", "1M", "--max-bytes", "1M"]) == 0
    out = capsys.readouterr().out
    assert "fat tree of 8 nodes per leaf, oversubscribed 4:1" in out
    cells = [line.split() for line in out.splitlines()]
    rows = {c[0]: float(c[2]) for c in cells if c[:1] in (["rd"], ["ring"])}
    assert rows["rd"] > rows["ring"] > 0


def test_a_protocol_switch_adds_its_latency_from_its_size():
    """Messages of rendezvous_bytes and more pay rendezvous more: recursive doubling on 4 ranks,
    two steps."""
    m = network_only(rendezvous_bytes=4096, rendezvous=3e-6)
    assert run(programs("allreduce", "rd", 4, 2048), m).time == pytest.approx(2 * (2e-6 + 2048 / 10e9))
    assert run(programs("allreduce", "rd", 4, 4096), m).time == pytest.approx(2 * (5e-6 + 4096 / 10e9))


def test_calibration_finds_the_protocol_switch():
    """One-way times that jump by 4 us from 16 KiB on (above alpha + n / bandwidth) give that size
    and that latency; times that follow the line give none."""
    from pycoll.sim.calibrate import rendezvous

    alpha, bw = 5e-6, 10e9
    line = {n: alpha + n / bw for n in (1024, 4096, 16384, 65536)}
    assert rendezvous(line, alpha, bw) == (0, 0.0)
    jumped = {n: t + (4e-6 if n >= 16384 else 0.0) for n, t in line.items()}
    limit, extra = rendezvous(jumped, alpha, bw)
    assert limit == 16384 and extra == pytest.approx(4e-6)
