"""pycoll.sim: the real algorithms' programs of many ranks simulated against an alpha-beta-gamma
machine agree with the closed forms; stragglers, custom schedules, machine files and the CLI."""

import json
import math

import pytest

from pycoll import algorithms
from pycoll.cli import main as cli
from pycoll.sim import Machine, load, programs, run
from pycoll.sim.formulas import predicted
from pycoll.sim.machine import from_dict
from pycoll.sim.programs import moved

FLAT = Machine(alpha=2e-6, bandwidth=10e9, reduce_bw=5e9, copy_bw=math.inf)

#: (collective, algorithm, ranks): the O(p^2) ones (rings) at 64 ranks, the rest at 64 and 1,024.
CASES = [(c, a, p) for c, a in [("allreduce", "rd"), ("allreduce", "rabenseifner"), ("bcast", "knomial"),
                                 ("allgather", "rd"), ("reduce_scatter", "rhalving")] for p in (64, 1024)]
CASES += [("allreduce", "ring", 64), ("bcast", "scatter_allgather", 64), ("allgather", "ring", 64),
          ("reduce_scatter", "ring", 64)]


@pytest.mark.parametrize("coll,alg,p", CASES)
def test_closed_forms(coll, alg, p):
    for nominal in (8, 64 << 10, 4 << 20):
        nbytes = moved(coll, alg, nominal, p, 4)
        res = run(programs(coll, alg, p, nominal), FLAT)
        want = predicted(coll, alg, p, nbytes, FLAT)
        assert not res.unmatched
        assert abs(res.time / want - 1) < 0.05, (coll, alg, p, nbytes, res.time, want)


def test_a_late_rank_and_a_slow_rank_shift_the_end():
    """A bcast's root that starts 10 us late ends it 10 us later; a rank twice as slow in an
    allreduce makes every step as slow as its own."""
    progs = programs("bcast", "knomial", 16, 1 << 20)
    base = run(progs, FLAT).time
    assert run(progs, FLAT, start={0: 10e-6}).time == pytest.approx(base + 10e-6)
    progs = programs("allreduce", "rd", 16, 1 << 20)
    step = FLAT.alpha + (1 << 20) * (1 / FLAT.bandwidth + 1 / FLAT.reduce_bw)
    slow = run(progs, FLAT, slow={3: 2.0}).time
    assert slow == pytest.approx(4 * (step + (1 << 20) * (1 / FLAT.bandwidth + 1 / FLAT.reduce_bw)), rel=0.05)


def test_nodes_make_the_first_steps_cheaper():
    """8 ranks per node: recursive doubling's three first steps stay in the node."""
    m = Machine(alpha=2e-6, bandwidth=10e9, ppn=8, node_alpha=0.5e-6, node_bandwidth=50e9, reduce_bw=math.inf,
                copy_bw=math.inf)
    n = 1 << 20
    want = 3 * (0.5e-6 + n / 50e9) + 3 * (2e-6 + n / 10e9)
    assert run(programs("allreduce", "rd", 64, n), m).time == pytest.approx(want)


def test_a_custom_schedule_simulates():
    """A user's schedule of primitive tasks (examples/lowered_schedule.py) simulates like rd."""
    from examples.lowered_schedule import register

    saved = dict(algorithms.MODULES["allreduce"]), dict(algorithms.ALGORITHMS["allreduce"])
    try:
        register()
        mine = run(programs("allreduce", "rdprim", 64, 1 << 20), FLAT).time
    finally:
        for table, old in zip((algorithms.MODULES["allreduce"], algorithms.ALGORITHMS["allreduce"]), saved):
            table.clear()
            table.update(old)
    assert mine == pytest.approx(predicted("allreduce", "rd", 64, 1 << 20, FLAT), rel=0.01)


def test_machine_files(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('[network]\nalpha = "1.5us"\nbandwidth = "100Gbit/s"\n[node]\nppn = 4\n'
                    '[compute]\nreduce = "8GB/s"\ncopy = "inf"\n')
    m = load(str(path))
    assert (m.alpha, m.bandwidth, m.ppn, m.reduce_bw, m.copy_bw) == (1.5e-6, 12.5e9, 4, 8e9, math.inf)
    with pytest.raises(ValueError, match="unknown key 'latency'"):
        from_dict({"network": {"latency": 1}})
    with pytest.raises(ValueError, match="not a time"):
        from_dict({"network": {"alpha": "2 parsecs"}})


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert cli(["sim", "allreduce", "-n", "256", "--algorithm", "rd,ring", "--min-bytes", "1M",
                "--max-bytes", "1M", "--json", str(out), "--stats"]) == 0
    text = capsys.readouterr().out
    assert "pycoll sim allreduce on 256 ranks" in text and "formula_us" in text
    rows = json.loads(out.read_text())["rows"]
    assert [r["algorithm"] for r in rows] == ["rd", "ring"]
    for r in rows:
        assert r["time_us"] == pytest.approx(r["formula_us"], rel=0.05) and r["events"] > 0


def test_tune_writes_rules_pycoll_reads(capsys):
    """--tune: the fastest simulated algorithm per size as PYCOLL_TUNE rules (parsed back by
    pycoll), with where the default table picks another."""
    from pycoll import algorithms
    from pycoll.algorithms import tuning

    assert cli(["sim", "allreduce", "-n", "64", "--algorithm", "rd,knomial,ring", "--min-bytes", "8",
                "--max-bytes", "4M", "--tune"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("PYCOLL_TUNE="))
    rules = tuning.parse(line.split("=", 1)[1], algorithms.ALGORITHMS)
    assert rules[0].msg[0] == 0 and rules[-1].msg[1] == math.inf and rules[0].team == (64, 64)
    # latency first (k-nomial: log_4 p steps), then bandwidth (ring)
    assert [r.algorithm for r in rules] == ["knomial", "rd", "ring"], line


@pytest.mark.parametrize("coll,alg,n,nbytes", [
    ("allreduce", "rd", 64, 8), ("allreduce", "ring", 16, 1 << 20),
    ("allreduce", "rabenseifner", 33, 1 << 16), ("bcast", "scatter_allgather", 16, 1 << 20),
    ("allgather", "bruck", 13, 1 << 12), ("alltoall", "pairwise", 9, 9 * 64),
    ("reduce_scatter", "rhalving", 12, 12 * 1024)])
def test_the_native_loop_gives_the_python_loops_times_to_the_bit(coll, alg, n, nbytes):
    """Without contention, deaths, timeline or payload the loop runs in C: the same events in the
    same order, so every time, count and finish is the Python loop's exactly (late and slow ranks,
    nodes, overhead, rendezvous and LogGP's gap and per-byte overhead included)."""
    progs = programs(coll, alg, n, nbytes)
    machines = [Machine(), Machine(ppn=4, overhead=1e-6, rendezvous_bytes=8192, rendezvous=3e-6,
                                   reduce_bw=math.inf),
                Machine(ppn=2, overhead=0.3e-6, overhead_per_byte=0.2e-9, gap=1.5e-6)]
    for m in machines:
        for kw in ({}, {"start": {1: 3e-6}, "slow": {2: 1.5}}):
            a, b = run(progs, m, native=False, **kw), run(progs, m, **kw)
            assert (a.time, a.finish, a.events, a.messages, a.bytes_sent, a.unmatched) == \
                   (b.time, b.finish, b.events, b.messages, b.bytes_sent, b.unmatched), (m, kw)


def test_the_native_loop_reports_what_never_ran():
    from pycoll.sim.engine import RECV, SEND, Compact

    waits = Compact.build([RECV, SEND], [1, 1], [0, 5], [8, 8], [[], [0]])  # its peer never sends
    idle = Compact.build([], [], [], [], [])
    for native in (False, True):
        res = run([waits, idle], Machine(), native=native)
        assert res.unmatched == ["rank 0: 2 instructions never ran"], (native, res.unmatched)


def test_the_native_loop_checks_the_arrays_it_reads():
    """A dependent past its program, a peer past the ranks or a bad kind: the C loop reads
    nothing and declines (None: the Python loop runs instead)."""
    from array import array

    from pycoll.sim.engine import RECV, SEND, Compact, _run_native

    good = Compact.build([SEND, RECV], [1, 1], [0, 0], [8, 8], [[], [0]])
    assert _run_native([good, good], Machine(), [0.0, 0.0], [1.0, 1.0], 0.0) is not None
    for field, bad in (("dependents", array("i", [7])), ("peers", array("i", [5, 1])),
                       ("kinds", array("b", [9, RECV]))):
        broken = Compact.build([SEND, RECV], [1, 1], [0, 0], [8, 8], [[], [0]])
        setattr(broken, field, bad)
        assert _run_native([broken, good], Machine(), [0.0, 0.0], [1.0, 1.0], 0.0) is None, field


def test_no_ranks_and_programs_of_other_shapes_run_in_python():
    from array import array

    from pycoll.sim.engine import RECV, SEND, Compact, _run_native

    assert run([], Machine()).time == 0.0 and _run_native([], Machine(), [], [], 0.0) is None
    short = Compact.build([SEND, RECV], [1, 1], [0, 0], [8, 8], [[], [0]])
    short.peers = array("i", [1])  # (one peer for two instructions)
    wide = Compact.build([SEND, RECV], [1, 1], [0, 0], [8, 8], [[], [0]])
    wide.peers = array("l", [1, 1])
    good = Compact.build([SEND, RECV], [1, 1], [0, 0], [8, 8], [[], [0]])
    for broken in (short, wide):
        assert _run_native([broken, good], Machine(), [0.0, 0.0], [1.0, 1.0], 0.0) is None


def test_recording_sizes_only_gives_the_same_compact_programs():
    """The simulator records each slice's size alone (no buffer lookup): the same instructions,
    peers, steps, sizes and dependencies as the full recording, for every algorithm it simulates."""
    from pycoll.lower.record import record
    from pycoll.sim.cli import ALL
    from pycoll.sim.engine import Compact
    from pycoll.sim.programs import COMPOSITES, SIMULATED, _call, elements
    from pycoll.team import local_teams

    fields = ("kinds", "peers", "steps", "nbytes", "ndeps", "first", "dependents")
    for coll, algs in ALL.items():
        if coll not in SIMULATED:
            continue
        for alg in algs:
            if (coll, alg) in COMPOSITES:
                continue
            for n, nbytes in ((5, 4096), (8, 1 << 16)):
                teams = local_teams(n)
                try:
                    for t in teams:
                        call = _call(t, coll, elements(coll, nbytes, n, 4), "float32", "sum", 0)
                        program = record(t, call, alg, compute=False)
                        # (each instruction's dependencies in order, none twice: Recorder.add's)
                        assert all(i.deps == sorted(set(i.deps)) for i in program.instrs), (coll, alg, n)
                        full = Compact.of(program)
                        lean = Compact.of(record(t, call, alg, compute=False, sizes_only=True))
                        assert all(getattr(full, f) == getattr(lean, f) for f in fields), (coll, alg, n)
                finally:
                    for t in teams:
                        t.close()
    # a schedule of primitive tasks (the ring allreduce's lowered form) is recorded task by task
    teams = local_teams(5)
    try:
        for t in teams:
            call = _call(t, "allreduce", 3000, "float32", "sum", 0)
            full = Compact.of(record(t, call, "ring", compute=False))
            lean = Compact.of(record(t, call, "ring", compute=False, sizes_only=True))
            assert len(full.kinds) >= 20 and all(getattr(full, f) == getattr(lean, f) for f in fields)
    finally:
        for t in teams:
            t.close()


def test_compact_forms_and_chains_match_their_plain_definitions():
    """Compact.build and chain (numpy) against the plain loops they replaced, on random DAGs and on
    the programs the composites chain."""
    import random

    from pycoll.sim.engine import Compact
    from pycoll.sim.programs import chain

    def plain_build(deps):
        after = [[] for _ in deps]
        for i, ds in enumerate(deps):
            for d in ds:
                after[d].append(i)
        first, flat = [0], []
        for a in after:
            flat.extend(a)
            first.append(len(flat))
        return first, flat

    def plain_chain(a, b):
        n = len(a.kinds)
        offset = max(a.steps, default=-1) + 1
        sinks = [i for i in range(n) if a.first[i] == a.first[i + 1]]
        deps = a.deps() + [[n + d for d in ds] or sinks for ds in b.deps()]
        steps = list(a.steps) + [s + offset for s in b.steps]
        return Compact.build(list(a.kinds) + list(b.kinds), list(a.peers) + list(b.peers), steps,
                             list(a.nbytes) + list(b.nbytes), deps)

    rng = random.Random(7)
    fields = ("kinds", "peers", "steps", "nbytes", "ndeps", "first", "dependents")
    for _ in range(50):
        made = []
        for _ in range(2):
            n = rng.randint(0, 12)
            deps = [sorted(rng.sample(range(i), rng.randint(0, min(i, 3)))) for i in range(n)]
            kinds, peers = [rng.randint(0, 4) for _ in range(n)], [rng.randint(0, 3) for _ in range(n)]
            steps, sizes = [rng.randint(0, 9) for _ in range(n)], [rng.randint(0, 99) for _ in range(n)]
            c = Compact.build(kinds, peers, steps, sizes, deps)
            first, flat = plain_build(deps)
            assert list(c.first) == first and list(c.dependents) == flat and c.deps() == deps
            made.append(c)
        a, b = made
        fast, slow = chain(a, b), plain_chain(a, b)
        assert all(list(getattr(fast, f)) == list(getattr(slow, f)) for f in fields)
    a, b = programs("reduce_scatter", "ring", 5, 5 * 1024), programs("allgather", "ring", 5, 5 * 1024)
    for x, y in zip(a, b):
        fast, slow = chain(x, y), plain_chain(x, y)
        assert all(list(getattr(fast, f)) == list(getattr(slow, f)) for f in fields)


#: Run in a process of its own (test_programs_recorded_by_several_processes_are_the_same): forking
#: from pytest, whose other tests may leave threads running, is what the recording refuses to do.
_PARALLEL = """
import os, sys
from pycoll.lower.record import NotLowerable
from pycoll.sim.programs import PARALLEL_FROM, programs
module = sys.modules["pycoll.sim.programs"]
forked = []
real = module._record_in_processes
module._record_in_processes = lambda shares, progress: forked.append(len(shares)) or real(shares, progress)
fields = ("kinds", "peers", "steps", "nbytes", "ndeps", "first", "dependents")
n = PARALLEL_FROM
cases = (("allreduce", "rd", 4096), ("allreduce", "ring", 1 << 16), ("bcast", "knomial", 64))
for coll, alg, nbytes in cases:
    alone = programs(coll, alg, n, nbytes, jobs=1)
    told = []
    shared = programs(coll, alg, n, nbytes, progress=told.append, jobs=3)
    assert sorted(told) == list(range(n)), (coll, alg)
    assert len(alone) == len(shared) == n
    for a, b in zip(alone, shared):
        assert all(getattr(a, f) == getattr(b, f) for f in fields), (coll, alg)
assert forked == [3, 3, 3, 3], forked  # (jobs=1 here; jobs=3 in three processes; the ring: two parts)
try:  # a worker's error reaches the caller
    programs("allreduce", "shm", n, 1 << 20, jobs=2)
    raise SystemExit("no NotLowerable")
except NotLowerable as exc:
    assert "cannot be built on an in-process team" in str(exc), exc
module._record_ranks = lambda *share, **kw: os._exit(3)  # (a worker that dies: an error, not a wait)
try:
    programs("allreduce", "rd", n, 8, jobs=2)
    raise SystemExit("no RuntimeError")
except RuntimeError as exc:
    assert "ranks 0-127 ended (exit code 3)" in str(exc), exc
print("OK")
"""


def test_programs_recorded_by_several_processes_are_the_same():
    """From PARALLEL_FROM ranks the programs are recorded by processes side by side: the same
    programs, in rank order, with every rank's progress told once; a worker's error is raised in
    the caller, and a worker that dies is an error, not a wait."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PARALLEL], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stdout + done.stderr


def test_a_recording_of_sizes_refuses_what_the_full_one_refuses():
    """A buffer that is not contiguous cannot be an instruction's slice, however it is recorded;
    jobs below 1 are refused."""
    import numpy as np

    from pycoll.lower.record import NotLowerable, Recorder

    strided = np.zeros(16, np.float32)[::2]
    for sizes_only in (False, True):
        rec = Recorder(0, sizes_only)
        rec.name(np.zeros(16, np.float32), "dst")
        with pytest.raises(NotLowerable, match="not contiguous"):
            rec.message("send", strided, 1, 0)
        with pytest.raises(NotLowerable, match="not contiguous"):
            rec.computation("copy", {"src": strided, "dst": strided})
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        programs("allreduce", "rd", 4, 8, jobs=0)


def test_loggp_gap_and_per_byte_overhead_give_the_logp_times():
    """LogGP(S): k messages of n bytes from rank 0 to rank 1, posted at once, start on the link
    ``gap`` apart (g above o + nO and nG): the last arrives at o + nO + (k - 1) g + nG + L; with g = 0 they
    leave as fast as the sender posts them (posting being slower than the link here),
    o + nO + (k - 1)(o + nO) + nG + L. The C loop and the Python loop agree."""
    from pycoll.sim.engine import RECV, SEND, Compact

    k, n, L, o, O, G = 5, 1000, 2e-6, 0.5e-6, 0.1e-9, 0.1e-9  # noqa: N806, E741 - LogGP's names
    send = Compact.build([SEND] * k, [1] * k, list(range(k)), [n] * k, [[] for _ in range(k)])
    recv = Compact.build([RECV] * k, [0] * k, list(range(k)), [n] * k, [[] for _ in range(k)])
    post = o + n * O
    for g, want in ((3e-6, post + (k - 1) * 3e-6 + n * G + L), (0.0, post + (k - 1) * post + n * G + L)):
        m = Machine(alpha=L, bandwidth=1 / G, overhead=o, overhead_per_byte=O, gap=g)
        for native in (False, True):
            assert run([send, recv], m, native=native).time == pytest.approx(want, rel=1e-12), (g, native)
    m = from_dict({"network": {"gap": "2us"}, "compute": {"overhead_per_byte": "0.1ns"}})
    assert m.gap == pytest.approx(2e-6) and m.overhead_per_byte == pytest.approx(1e-10)
    assert "gap 2us" in m.describe() and "0.1ns/B" in m.describe()


def test_the_cli_takes_loggps_parameters_and_refuses_bad_values(tmp_path, capsys):
    """``--overhead``, ``--overhead-per-byte`` and ``--gap`` set o, O and g (a 2-rank exchange of
    1 KiB: o + 1024 O to post, then the link); a value that is not a time is a clear error (exit
    2), not a traceback, as is a negative one."""
    out = tmp_path / "rows.json"
    assert cli(["sim", "allreduce", "-n", "2", "--algorithm", "rd", "--min-bytes", "1K", "--max-bytes", "1K",
                "--alpha", "2us", "--bandwidth", "1GB/s", "--reduce", "inf", "--overhead", "1us",
                "--overhead-per-byte", "1ns", "--gap", "5us", "--json", str(out)]) == 0
    assert "gap 5us" in capsys.readouterr().out
    row = json.loads(out.read_text())["rows"][0]
    # each rank posts its send (o + 1024 O = 2.024 us), whose 1 KiB leaves then (1.024 us) and
    # arrives alpha later (5.048 us), after the rank posted its receive (4.048 us); the gap binds no
    # second message
    assert row["time_us"] == pytest.approx(2.024 + 1.024 + 2, rel=1e-9)
    for bad in (["--alpha", "soon"], ["--gap=-1us"], ["--overhead", "fast"], ["--late", "1:soon"],
                ["--slow", "2"]):
        assert cli(["sim", "allreduce", "-n", "4", *bad]) == 2, bad
        assert "pycoll sim:" in capsys.readouterr().err
