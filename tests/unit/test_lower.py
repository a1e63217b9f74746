"""Lowering algorithms to programs (pycoll.lower): every point-to-point algorithm that is one step
generator lowers and its programs give the algorithm's bits; programs round-trip through JSON; a
malformed program or set is rejected before anything is sent."""

import json

import numpy as np
import pytest

import pycoll
from pycoll import algorithms
from pycoll.cli import main as cli
from pycoll.lower import NotLowerable, ProgramError, check_set, from_json, loads, lower
from pycoll.lower.record import LOWERED, NATIVE

#: What does not lower, and why (a schedule of tasks, or numpy calls the recording does not see).
NOT_LOWERED = {("allreduce", "rab"), ("allreduce", "split_rail")}
SEGMENT = {"shm", "cma", "mapped", "hier"}


def p2p_algorithms():
    for coll in LOWERED:
        for name in algorithms.ALGORITHMS[coll]:
            if name not in SEGMENT and (coll, name) not in NOT_LOWERED:
                yield coll, name


@pytest.mark.parametrize("coll,name", list(p2p_algorithms()))
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_programs_give_the_algorithms_bits(coll, name, n):
    """lower() runs the programs against the algorithm on the same inputs and raises unless every
    rank's output has the same bits; here at counts 0, 1, odd and large, several dtypes and ops."""
    if coll in ("allreduce", "reduce", "reduce_scatter", "reduce_scatterv"):
        cases = [("float32", "sum"), ("int64", "max"), ("bfloat16", "avg"), ("float16", "prod")]
    elif coll in ("scan", "exscan"):  # (AVG is no prefix reduction)
        cases = [("float32", "sum"), ("int64", "max"), ("float16", "prod")]
    else:
        cases = [("float32", "sum"), ("uint8", "sum")]
    for count in ((0,) if coll == "barrier" else (0, 1, 7, 1000)):
        for dtype, op in cases:
            programs = lower(coll, name, n, count, dtype, op, root=n - 1)
            assert [p.rank for p in programs] == list(range(n))
            if n > 1 and count and coll != "barrier":
                assert any(i.kind == "send" for p in programs for i in p.instrs)
            if coll.endswith("v"):  # (made for one layout: see test_a_program_runs_only_its_layout)
                assert all(p.layout is not None for p in programs)
    if coll in ("allreduce", "reduce"):
        lower(coll, name, n, 100, "float32", "sum", in_place=True)


@pytest.mark.parametrize("coll,name", sorted(NATIVE))
def test_recording_without_computing_gives_the_same_program(coll, name):
    """The planner records a native program without computing (the reductions and copies of a
    large call would cost what the call does): the same instructions as the verified recording."""
    from pycoll.lower.record import record
    from pycoll.lower.verify import make_call

    teams = pycoll.local_teams(3)
    for count in ((0,) if coll == "barrier" else (1, 1000)):
        for t in teams:
            call = make_call(t, coll, count, "float32", "sum", 2, False, seed=0)
            assert record(t, call, name, compute=False).to_json() == record(t, call, name).to_json()
    for t in teams:
        t.close()


@pytest.mark.parametrize("coll,name", sorted(NOT_LOWERED))
def test_what_does_not_lower_says_why(coll, name):
    with pytest.raises(NotLowerable, match="not one step generator|does not see|not a Schedule of primitive"):
        lower(coll, name, 4, 64)


def test_json_round_trip_and_cli():
    programs = lower("allreduce", "rd", 3, 5)
    for p in programs:
        again = loads(p.dumps())
        assert again.to_json() == p.to_json()
    check_set([loads(p.dumps()) for p in programs])


def test_a_program_runs_only_its_layout():
    """A v-collective's program is made for one layout of blocks: it round-trips through JSON, and
    a call with other counts or displacements (even of the same total size) is refused before
    anything is sent (it would put the blocks in the wrong places)."""
    from pycoll.lower.execute import fits
    from pycoll.lower.verify import v_counts, v_displs

    programs = lower("allgatherv", "ring", 2, 3)
    again = loads(programs[0].dumps())
    assert again.layout == programs[0].layout and again.to_json() == programs[0].to_json()
    teams = pycoll.local_teams(2)
    counts = v_counts(2, 3)
    displs = v_displs(counts)
    room = displs[-1] + counts[-1] + 1
    mine = np.zeros(counts[0], np.float32)
    fits(again, teams[0], teams[0].call("allgatherv", mine, np.zeros(room, np.float32), counts, displs))
    moved = [d + 1 if j else d for j, d in enumerate(displs)]  # the same total, rank 1's block one later
    with pytest.raises(ProgramError, match="blocks"):
        fits(again, teams[0], teams[0].call("allgatherv", mine, np.zeros(room, np.float32), counts, moved))
    d = again.to_json()
    d["layout"] = [[0, -1]] * 2
    with pytest.raises(ProgramError, match="layout"):
        from_json(d)
    for t in teams:
        t.close()


def test_cli_prints_a_program(capsys):
    assert cli(["lower", "allreduce", "--algorithm", "knomial", "-n", "8", "--rank", "0"]) == 0
    p = loads(capsys.readouterr().out)
    assert (p.rank, p.size, p.count, p.coll) == (0, 8, 1024, "allreduce")
    assert cli(["lower", "bcast", "--algorithm", "knomial", "-n", "3"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    assert cli(["info"]) == 0  # pycoll info says which algorithms lower
    listed = capsys.readouterr().out.split("lowered: ")[1].split("\n")[0].split(", ")
    assert sorted(listed) == sorted(f"{c}:{a}" for c, a in p2p_algorithms())
    assert NATIVE == set(p2p_algorithms())  # the planner's native path: exactly what is checked here


def _edit(program, change):
    d = program.to_json()
    change(d)
    return d


def test_malformed_programs_are_rejected():
    p = lower("allreduce", "rd", 4, 8)[0]

    def out_of_bounds(d):
        d["instructions"][0]["buf"] = ["src", 16, 32]

    def forward(d):
        d["instructions"][0]["deps"] = [len(d["instructions"]) - 1]

    def unknown(d):
        d["instructions"][0]["kind"] = "teleport"

    def no_buffer(d):
        d["instructions"][0]["buf"] = ["elsewhere", 0, 4]

    def self_peer(d):
        d["instructions"][0]["peer"] = 0

    def far_step(d):
        d["instructions"][0]["step"] = 1 << 31

    for change, words in ((out_of_bounds, "lies outside"), (forward, "no cycles"), (unknown, "unknown kind"),
                          (no_buffer, "does not have"), (self_peer, "not another rank"),
                          (far_step, "not in 0..4095")):
        with pytest.raises(ProgramError, match=words):
            from_json(_edit(p, change))
    with pytest.raises(ProgramError, match="not a pycoll program"):
        loads('{"format": "something else"}')
    with pytest.raises(ProgramError, match="not JSON"):
        loads("{")


def test_unmatched_receives_are_rejected_as_a_set():
    programs = lower("allreduce", "rd", 2, 8)
    sends = [i for i, ins in enumerate(programs[0].instrs) if ins.kind == "send"]
    d = programs[0].to_json()
    del d["instructions"][sends[0]]
    for ins in d["instructions"]:
        ins["deps"] = [x - (x > sends[0]) for x in ins["deps"] if x != sends[0]]
    with pytest.raises(ProgramError, match="receives from rank 0 .* sends nothing more"):
        check_set([from_json(d), programs[1]])
    short = programs[1].to_json()
    recv = next(i for i in short["instructions"] if i["kind"] == "recv")
    short["buffers"]["small"] = 4
    recv["buf"] = ["small", 0, 4]
    with pytest.raises(ProgramError, match="takes 4 B"):
        check_set([programs[0], from_json(short)])


def test_run_program_in_process_and_wrong_rank():
    n = 4
    programs = lower("allreduce", "knomial", n, 10)
    teams = pycoll.local_teams(n)
    try:
        xs = [np.arange(10, dtype=np.float32) + r for r in range(n)]
        outs = [np.empty(10, np.float32) for _ in range(n)]
        reqs = [t.run_program(p, x, o) for t, p, x, o in zip(teams, programs, xs, outs)]
        for r in reqs:
            r.wait(timeout=30)
        for o in outs:
            assert np.array_equal(o, sum(xs))
        with pytest.raises(ProgramError, match="rank 1 of 4 given to rank 0"):
            teams[0].run_program(programs[1], xs[0], outs[0])
        with pytest.raises(ProgramError, match="of 10 x float32 given allreduce of 5 x"):
            teams[0].run_program(programs[0], xs[0][:5], outs[0][:5])
        with pytest.raises(ProgramError, match="for op sum given max"):
            teams[0].run_program(programs[0], xs[0], outs[0], "max")
        with pytest.raises(ProgramError, match="out of place given a call in place"):
            teams[0].run_program(programs[0], xs[0])
        bcast = lower("bcast", "knomial", n, 10, root=0)
        with pytest.raises(ProgramError, match="for root 0 given root 2"):
            teams[0].run_program(bcast[0], xs[0], 2)
        edited = lower("allreduce", "knomial", n, 10)[0]
        recv = next(i for i in edited.instrs if i.kind == "recv")
        recv.slices["buf"] = ("dst", 0, 4000)  # (a program changed after it was loaded is checked again)
        with pytest.raises(ProgramError, match="lies outside"):
            teams[0].run_program(edited, xs[0], outs[0])
        # none of these took a sequence number: the ranks still agree, the next program runs
        reqs = [t.run_program(p, x, o) for t, p, x, o in zip(teams, programs, xs, outs)]
        for r in reqs:
            r.wait(timeout=30)
    finally:
        for t in teams:
            t.close()


# ---------------------------------------------------------------- schedules of primitive tasks
@pytest.fixture
def registered():
    """The allreduce algorithms as they were, after the test registered its own."""
    before = (dict(algorithms.MODULES["allreduce"]), dict(algorithms.ALGORITHMS["allreduce"]))
    yield
    for table, saved in zip((algorithms.MODULES["allreduce"], algorithms.ALGORITHMS["allreduce"]), before):
        table.clear()
        table.update(saved)


def _primitive_algorithm(name, build):
    import types

    return types.SimpleNamespace(NAME=name, COLLECTIVES=("allreduce",), OPTIONS={}, build=build,
                                 LOWERABLE=True, __name__=name)


@pytest.mark.usefixtures("registered")
def test_a_users_schedule_of_primitive_tasks_lowers_with_its_bits():
    """examples/lowered_schedule.py's recursive doubling (copy, send, receive, reduce tasks): its
    programs give the schedule's bits for several dtypes, ops and in place; and one instruction per
    task, each depending on the instructions of the tasks it waits for."""
    from examples.lowered_schedule import main

    main(4)  # (lower() raises unless the bits agree)
    p = lower("allreduce", "rdprim", 2, 3, "float32")[0]
    assert [i.kind for i in p.instrs] == ["copy", "send", "recv", "reduce"]
    assert [i.deps for i in p.instrs] == [[], [0], [0], [1, 2]]
    assert set(p.buffers) == {"src", "dst", "scratch0"}
    from pycoll.lower.record import runs_native

    assert runs_native("allreduce", "rdprim") and not runs_native("allreduce", "rdprim_py")


@pytest.mark.usefixtures("registered")
def test_schedules_with_python_in_them_do_not_lower():
    """A FunctionTask, a task on another channel, a tag that is not a step, a wait for a start:
    NotLowerable, naming the task; such a schedule still runs as Python."""
    from pycoll.tasks import FunctionTask, RecvTask, Schedule, SendTask

    def builder(kind):
        def build(args):
            s = Schedule(name=args.name)
            peer = (args.rank + 1) % args.size
            send = s.add(SendTask(args.channel, args.dst, peer, ("x", 1) if kind == "tag" else 0))
            recv = RecvTask(args.channel, np.empty_like(args.dst), (args.rank - 1) % args.size, 0)
            if kind == "started":
                recv.depends_on(send, pycoll.Event.STARTED)
            s.add(recv)
            if kind == "function":
                s.add(FunctionTask(print, "hi"), after=recv)
            return s
        return build

    for kind, why in (("function", "not a primitive task"), ("tag", "not a step"), ("started", "to start")):
        algorithms.register(_primitive_algorithm(f"prim_{kind}", builder(kind)), replace=True)
        with pytest.raises(NotLowerable, match=why):
            lower("allreduce", f"prim_{kind}", 2, 4, verify=False)


def test_the_ring_allreduce_lowers_fragment_by_fragment():
    """The ring's pipeline lowers through its ``lowered`` form: every fragment's steps (the same
    messages as the pipeline's), fragments past the pipeline's depth reusing a slot's scratch after
    its reductions; the programs give the algorithm's bits, AVG and in place included."""
    n, count = 3, 600_000  # 2.4 MB: blocks of 200,000 floats in fragments of 87,381
    for op, in_place, dtype in (("sum", False, "float32"), ("avg", True, "float64")):
        programs = lower("allreduce", "ring", n, count, dtype, op, in_place=in_place)
        frags = -(-(count // n) // ((1 << 20) // (n * np.dtype(dtype).itemsize)))  # 3 and 5
        sends = [i for i in programs[0].instrs if i.kind == "send"]
        assert frags >= 3 and len(sends) == frags * 2 * (n - 1) and len({i.step for i in sends}) == len(sends)
        assert sum(name.startswith("scratch") for name in programs[0].buffers) == 2  # (depth 2)
        assert any(i.kind == "avg" for i in programs[0].instrs) == (op == "avg")


def test_a_reduce_task_divides_when_asked():
    """ReduceTask(divide_by=n): AVG's last step, as finish_avg divides (integers toward zero)."""
    from pycoll import Context
    from pycoll.tasks import ReduceTask

    c = Context(credit_bytes=0, partition_bytes=0, timeout=0)
    a, b, out = np.array([3, -7, 9]), np.array([4, 0, 1]), np.empty(3, np.int64)
    c.submit(ReduceTask(out, a, b, "avg", divide_by=2)).wait()
    assert out.tolist() == [3, -3, 5]
    f = np.empty(2)
    c.submit(ReduceTask(f, np.array([1.0, 2.0]), np.array([2.0, 2.0]), "sum")).wait()
    assert f.tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match="divide_by"):
        ReduceTask(f, f, f, "sum", divide_by=-1)
