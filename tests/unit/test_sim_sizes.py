"""pycoll.sim's measured-host model: rates and latencies by size (interpolated on the log of the
size), messages within a node copied by their receiver's core (``cpu_copies``), and loops of calls
with a call's own cost (``--calls``, ``[compute] call``), against hand-worked timelines."""

import json
import math

import pytest
import tomllib

from pycoll.cli import main as cli
from pycoll.sim import Machine, programs, run
from pycoll.sim.engine import Compact
from pycoll.sim.machine import from_dict, per_byte
from pycoll.sim.programs import looped

SEND, RECV, COPY = 0, 1, 3


def test_a_rate_between_two_sizes_is_interpolated_on_the_log_of_the_size():
    table = ((4096, 1e9), (16384, 2e9))
    assert per_byte(table, 5e9, 8192) == pytest.approx(0.5 / 1e9 + 0.5 / 2e9)
    assert per_byte(table, 5e9, 8) == pytest.approx(1 / 1e9)  # (the first and last hold beyond them)
    assert per_byte(table, 5e9, 1 << 30) == pytest.approx(1 / 2e9)
    assert per_byte((), 5e9, 8192) == pytest.approx(1 / 5e9)  # (no table: the bandwidth)


def test_machine_files_read_size_tables_and_refuse_bad_ones():
    m = from_dict({"node": {"ppn": 2, "bandwidth_by_size": {"64KiB": "2GB/s", "4096": "1GB/s"},
                            "alpha_by_size": {"4KiB": "1us", "1MiB": "30us"}, "cpu_copies": True},
                   "compute": {"reduce_by_size": {"4K": "10GB/s"}, "call": "2us"}})
    assert m.node_bandwidth_by_size == ((4096, 1e9), (65536, 2e9)) and m.cpu_copies and m.by_size
    assert m.call == pytest.approx(2e-6) and m.message(0, 1, 4096) == pytest.approx((1e-6, 1e-9))
    assert m.message(0, 1, 1 << 20)[0] == pytest.approx(30e-6)
    assert m.compute(True, 4096) == pytest.approx(4096 / 10e9)
    assert not Machine().by_size
    for bad in ({"node": {"bandwidth_by_size": {"lots": "1GB/s"}}},
                {"node": {"bandwidth_by_size": {"4K": "0"}}},
                {"node": {"bandwidth_by_size": {}}},
                {"compute": {"copy_by_size": "fast"}},
                {"network": {"alpha_by_size": {"4K": "soon"}}}):
        with pytest.raises(ValueError):
            from_dict(bad)


def _exchange_and_copy(n: int, copy: bool) -> list:
    """Two ranks that exchange ``n`` bytes, and (``copy``) each copies ``n`` bytes of its own at
    the same time, as a 2-rank alltoall does."""
    progs = []
    for r in range(2):
        kinds, deps = [SEND, RECV], [[], []]
        if copy:
            kinds.append(COPY)
            deps.append([])
        progs.append(Compact.build(kinds, [1 - r, 1 - r, -1][:len(kinds)], [0] * len(kinds), [n] * len(kinds),
                                   deps))
    return progs


def test_a_message_within_a_node_is_copied_by_its_receivers_core():
    """With cpu_copies an exchange's two messages are copied by two cores at once, but a rank's own
    copy and the copy of the message it receives take turns on its core; without, they overlap."""
    n, alpha, bw, copy_bw = 1 << 20, 10e-6, 1e9, 2e9
    base = dict(ppn=2, node_alpha=alpha, node_bandwidth=bw, reduce_bw=math.inf, copy_bw=copy_bw)
    cores = Machine(cpu_copies=True, **base)
    assert run(_exchange_and_copy(n, False), cores).time == pytest.approx(alpha + n / bw)
    assert run(_exchange_and_copy(n, True), cores).time == pytest.approx(n / copy_bw + n / bw)
    # a receive posted before the send: the copy it will make does not hold the core before it starts
    first = [Compact.build([RECV, SEND], [1 - r, 1 - r], [0, 0], [n, n], [[], []]) for r in range(2)]
    assert run(first, cores).time == pytest.approx(alpha + n / bw)
    assert run(_exchange_and_copy(n, True), Machine(**base)).time == pytest.approx(n / bw + alpha)


def test_a_loop_of_calls_pays_each_calls_start_and_overlaps_the_latency():
    """K broadcasts on 2 ranks, each call costing ``call`` and each message ``overhead`` on its
    rank: the root runs ahead (its sends are done when posted), the receiver copies each message
    when its receive is posted, so the loop takes K (call + overhead + n / rate) + alpha."""
    n, k, c, o, alpha, bw = 1 << 16, 4, 2e-6, 3e-6, 20e-6, 4e9
    m = Machine(ppn=2, node_alpha=alpha, node_bandwidth=bw, cpu_copies=True, call=c, overhead=o,
                reduce_bw=math.inf, copy_bw=math.inf)
    for k in (2, 3, 4, 5, 7):  # (built by doubling: every count)
        progs = looped(programs("bcast", "knomial", 2, n), k, call=True)
        assert run(progs, m).time == pytest.approx(k * (c + o + n / bw) + alpha), k
    assert run(looped(programs("bcast", "knomial", 2, n), 1, call=True), m).time == pytest.approx(
        c + o + alpha + n / bw)


def test_the_cli_simulates_a_loop_of_calls_per_call(tmp_path, capsys):
    """``pycoll sim --calls K`` prints the time per call of K calls in a loop; several ranks'
    programs that end at different steps still match call by call."""
    machine = tmp_path / "m.toml"
    machine.write_text('[node]\nppn = 8\nalpha = "2us"\nbandwidth = "10GB/s"\ncpu_copies = true\n'
                       '[compute]\ncall = "1us"\noverhead = "1us"\n')
    out = tmp_path / "sim.json"
    assert cli(["sim", "bcast", "-n", "6", "--machine", str(machine), "--algorithm", "knomial",
                "--min-bytes", "4K", "--max-bytes", "4K", "--calls", "5", "--json", str(out)]) == 0
    one = tmp_path / "one.json"
    assert cli(["sim", "bcast", "-n", "6", "--machine", str(machine), "--algorithm", "knomial",
                "--min-bytes", "4K", "--max-bytes", "4K", "--json", str(one)]) == 0
    looped_us = json.loads(out.read_text())["rows"][0]["time_us"]
    single_us = json.loads(one.read_text())["rows"][0]["time_us"]
    assert 0 < looped_us < single_us, (looped_us, single_us)  # (the calls' latencies overlap)
    assert cli(["sim", "bcast", "-n", "6", "--calls", "0"]) == 2
    capsys.readouterr()


def test_copies_of_two_cores_of_a_node_at_once_take_longer():
    """together_by_size: two ranks of one node copying at the same time share its caches and
    memory (the one that finds the other copying takes that many times longer); ranks of two
    nodes, or one rank at a time, do not."""
    n, copy_bw = 16 << 20, 10e9
    progs = [Compact.build([COPY], [-1], [0], [n], [[]]) for _ in range(2)]
    factors = ((1 << 20, 1.0), (16 << 20, 1.5))
    shared = Machine(ppn=2, cpu_copies=True, copy_bw=copy_bw, together_by_size=factors)
    assert run(progs, shared).time == pytest.approx(1.5 * n / copy_bw)
    apart = Machine(ppn=1, cpu_copies=True, copy_bw=copy_bw, together_by_size=factors)
    assert run(progs, apart).time == pytest.approx(n / copy_bw)
    late = run(progs, shared, start={1: n / copy_bw}).time  # (one after the other)
    assert late == pytest.approx(2 * n / copy_bw)
    with pytest.raises(ValueError):
        from_dict({"node": {"together_by_size": {"4K": 0.5}}})


@pytest.mark.parametrize("n", [3, 5, 6, 8])
def test_a_composite_allreduce_on_any_rank_count_finishes(n):
    """Rabenseifner's and the ring's two parts are chained with the second's steps after every
    rank's first (a rank whose first part ends at an earlier step still matches its peers)."""
    for alg in ("rabenseifner", "ring"):
        res = run(programs("allreduce", alg, n, 1 << 20), Machine(reduce_bw=5e9))
        assert not res.unmatched and res.time > 0, (alg, n, res.unmatched[:1])


def test_a_measured_hosts_model_refuses_shared_links_and_the_cli_says_so(tmp_path, capsys):
    m = Machine(ppn=2, cpu_copies=True, contention=True)
    with pytest.raises(ValueError, match="do not combine with shared links"):
        run(programs("allreduce", "rd", 2, 1024), m)
    machine = tmp_path / "m.toml"
    machine.write_text('[node]\nppn = 2\ncpu_copies = true\n[fabric]\nnodes_per_leaf = 1\n')
    assert cli(["sim", "allreduce", "-n", "2", "--machine", str(machine)]) == 2
    machine.write_text('[node]\ntogether_by_size = {"4KiB" = "x"}\n')
    assert cli(["sim", "allreduce", "-n", "2", "--machine", str(machine)]) == 2
    assert "[node] together_by_size" in capsys.readouterr().err


def test_a_sender_that_dies_before_its_message_is_there_loses_it():
    """With cpu_copies a send is done once posted, but its message is lost if the sender dies
    before it is there (alpha later): the receiver fails when it learns of the death."""
    m = Machine(ppn=2, node_alpha=10e-6, node_bandwidth=1e9, cpu_copies=True)
    progs = [Compact.build([SEND], [1], [0], [4096], [[]]), Compact.build([RECV], [0], [0], [4096], [[]])]
    assert not run(progs, m).errors
    res = run(progs, m, fail={0: (5e-6, 1e-3)})
    assert res.errors == {1: pytest.approx(5e-6 + 1e-3)}, res
    assert not run(progs, m, fail={0: (11e-6, 1e-3)}).errors  # (there before it died)


def test_a_half_duplex_link_takes_an_exchanges_two_messages_one_after_the_other():
    """Two ranks on two nodes exchange ``n`` bytes: on full-duplex links both messages move at once
    (alpha + n / bw); with ``half_duplex`` a rank's send and receive share its link (alpha + 2n / bw);
    a message one way costs the same either way."""
    n, alpha, bw = 1 << 20, 5e-6, 1e9
    full = Machine(alpha=alpha, bandwidth=bw, reduce_bw=math.inf, copy_bw=math.inf)
    half = Machine(alpha=alpha, bandwidth=bw, reduce_bw=math.inf, copy_bw=math.inf, half_duplex=True)
    exchange = _exchange_and_copy(n, False)
    assert run(exchange, full).time == pytest.approx(alpha + n / bw)
    assert run(exchange, half).time == pytest.approx(alpha + 2 * n / bw)
    one_way = [Compact.build([SEND], [1], [0], [n], [[]]), Compact.build([RECV], [0], [0], [n], [[]])]
    assert run(one_way, half).time == pytest.approx(run(one_way, full).time)
    assert half.by_size and "half duplex" in half.describe()
    assert from_dict({"network": {"half_duplex": True}}).half_duplex
    with pytest.raises(ValueError, match="half_duplex"):
        from_dict({"network": {"half_duplex": "yes"}})


def test_the_calibration_calls_a_link_half_duplex_from_its_exchange_and_writes_it_across_hosts():
    """Messages both ways at once that take 1.5x the time of one way or more are half duplex; the
    machine file says so for a pair on two hosts, never on one."""
    from pycoll.sim.calibrate import TABLE_SIZES, half_duplex, machine_file

    assert half_duplex(2.0) and half_duplex(1.5) and not half_duplex(1.1)
    rates = {n: 1e9 for n in TABLE_SIZES}
    sized = {"rates": rates, "latency": {1024: 2e-6, **{n: 3e-6 for n in TABLE_SIZES}}, "alpha": 2e-6,
             "together": {n: 1.0 for n in TABLE_SIZES}, "overhead": 1e-6, "call": 1e-6, "duplex": 1.9}
    p = {"alpha": 2e-6, "bandwidth": 1e9, "node_alpha": 2e-6, "node_bandwidth": 1e9, "ppn": 1, "nodes": 2,
         "rendezvous_bytes": 0, "rendezvous": 0.0, "reduce": 5e9, "copy": 5e9, "by_size": sized,
         "reduce_by_size": rates, "copy_by_size": rates}
    across = from_dict(tomllib.loads(machine_file(p, "test")))
    assert across.half_duplex and across.bandwidth_by_size and not across.cpu_copies
    one_host = dict(p, nodes=1, ppn=2)
    assert not from_dict(tomllib.loads(machine_file(one_host, "test"))).half_duplex
    full = dict(p, by_size=dict(sized, duplex=1.05))
    assert not from_dict(tomllib.loads(machine_file(full, "test"))).half_duplex
