"""Algorithm selection: the default table, PYCOLL_TUNE's syntax, its errors and precedence."""

import numpy as np
import pytest

import pycoll
from pycoll import algorithms
from pycoll.algorithms import tuning


def test_defaults():
    assert algorithms.select("allreduce", 2, 8) == "rd"
    assert algorithms.select("allreduce", 2, 8 << 20) == "ring"
    assert algorithms.select("allreduce", 4, 100) == "rd"
    assert algorithms.select("allreduce", 4, 1 << 20) == "ring"
    assert algorithms.select("allreduce", 4, 1 << 20, shared=True) == "shm"
    assert algorithms.select("allreduce", 1, 1 << 20, shared=True) == "rd"
    assert algorithms.select("bcast", 5, 10) == "knomial"
    assert algorithms.select("barrier", 5, 0, shared=True) == "shm"
    # cma only where the ranks may read each other's memory; then for 2 ranks from 2 MiB
    assert algorithms.select("allgather", 2, 4 << 20, shared=True) == "shm"
    assert algorithms.select("allgather", 2, 4 << 20, shared=True, cma=True) == "cma"
    assert algorithms.select("allgather", 2, 64 << 10, shared=True, cma=True) == "shm"
    assert algorithms.select("allgatherv", 2, 4 << 20, shared=False, cma=True) == "cma"  # tagged calls too
    assert algorithms.select("allgather", 4, 4 << 20, shared=True, cma=True) == "shm"
    # the v-forms that cannot select by size: the single copy wherever it is usable
    assert algorithms.select("alltoallv", 16, 64, shared=True, cma=True) == "cma"
    assert algorithms.select("scatterv", 3, 64 << 20, shared=True, cma=True, cma_slow=True) == "cma"
    assert algorithms.select("alltoallv", 16, 64, shared=True) == "shm"
    # tagged calls (not shared): the forms that publish addresses in the segment are passed over
    assert algorithms.select("alltoall", 4, 1 << 20, shared=False, cma=True) == "pairwise"
    assert algorithms.select("scatterv", 4, 1 << 20, shared=False, cma=True) == "linear"
    assert algorithms.select("bcast", 2, 256 << 10, shared=False, cma=True) == "knomial"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 64])
def test_every_collective_has_an_algorithm_at_every_size_and_team(n):
    """No call a user may make falls through the table (a 1-rank team's 16 MiB allreduce did)."""
    from pycoll.collectives import COLLECTIVES

    for coll in algorithms.ALGORITHMS:
        default = COLLECTIVES[coll].default if coll in COLLECTIVES else None
        for nbytes in [0] + [1 << k for k in range(31)]:
            for shared, cma, hier in ((False, False, False), (n > 1, n > 1, False), (False, False, n > 1)):
                for slow in (False, True):
                    name = algorithms.select(coll, n, nbytes, shared=shared, cma=cma, hier=hier,
                                             cma_slow=slow, default=default)
                    assert name, (coll, n, nbytes, shared, hier)


@pytest.mark.parametrize("coll,nbytes,fast,slow", [
    ("scatter", 64 << 10, "cma", "shm"), ("scatter", 2 << 20, "cma", "shm"),
    ("gather", 256 << 10, "cma", "shm"), ("alltoall", 64 << 10, "cma", "shm"),
    ("alltoall", 256 << 10, "cma", "cma"), ("bcast", 256 << 10, "cma", "cma")])
def test_a_slow_single_copy_keeps_two_ranks_on_the_segment(coll, nbytes, fast, slow):
    """Where process_vm_readv costs more than two copies (measured when the team is made), the
    two-rank scatter, gather and mid-size alltoall stay on the segment."""
    assert algorithms.select(coll, 2, nbytes, shared=True, cma=True) == fast
    assert algorithms.select(coll, 2, nbytes, shared=True, cma=True, cma_slow=True) == slow
    # more ranks: the cma rules measured on 4 and 16 ranks stand
    assert algorithms.select("scatter", 4, 1 << 20, shared=True, cma=True, cma_slow=True) == "cma"


def test_cma_cost_is_measured_in_copies():
    from pycoll.tl.shm import shm_available
    if not shm_available():
        pytest.skip("no native build")
    import os

    from pycoll.tl.shm.transport import cma_cost
    assert 0 < cma_cost(os.getpid(), 64 << 10, reps=3) < 100
    assert cma_cost(2 ** 22 + 12345, 4096, reps=1) == float("inf")  # no such process: no single copy


def test_parse_the_documented_examples():
    rules = tuning.parse("allreduce:0-4K:rd#allreduce:4K-inf:ring;bcast:0-inf:knomial", algorithms.ALGORITHMS)
    assert [(r.coll, r.algorithm, r.msg) for r in rules] == [
        ("allreduce", "rd", (0, 4096)), ("allreduce", "ring", (4096, tuning.INF)),
        ("bcast", "knomial", (0, tuning.INF))]
    (rule,) = tuning.parse("allreduce:team=2-2:0-8M:@knomial:mem=host", algorithms.ALGORITHMS)
    assert rule.team == (2, 2) and rule.msg == (0, 8 << 20) and rule.algorithm == "knomial"
    assert rule.mem == "host"
    assert tuning.parse("  ", algorithms.ALGORITHMS) == []


@pytest.mark.parametrize("text,token", [
    ("allreduce:0-4K:nope", "'nope'"),
    ("allgatherz:0-4K:rd", "'allgatherz'"),
    ("allreduce:4K-1K:rd", "'4K-1K'"),
    ("allreduce:0-4Q:rd", "'0-4Q'"),
    ("allreduce:0-4K", "'allreduce:0-4K'"),
    ("allreduce:0-4K:rd:ring", "'ring'"),
    ("allreduce:team=x-2:rd", "'team=x-2'"),
    ("allreduce:mem=gpu:rd", "'mem=gpu'"),
    ("allreduce::rd", "'allreduce::rd'"),
])
def test_malformed_strings_point_at_the_bad_token(text, token):
    with pytest.raises(pycoll.ConfigError, match=token):
        tuning.parse(text, algorithms.ALGORITHMS)


def test_tune_overrides_defaults_for_teams(monkeypatch):
    monkeypatch.setenv("PYCOLL_TUNE", "allreduce:0-1K:knomial#allreduce:1K-inf:ring")
    assert algorithms.select("allreduce", 2, 100) == "knomial"
    assert algorithms.select("allreduce", 2, 4096) == "ring"
    teams = pycoll.local_teams(3)
    bufs = [np.ones(10) for _ in teams]
    reqs = [t.allreduce(b) for t, b in zip(teams, bufs)]
    pycoll.wait_all(reqs)
    assert reqs[0].task.name.startswith("allreduce:knomial")
    monkeypatch.setenv("PYCOLL_TUNE", "allreduce:0-1K:rd:oops")
    with pytest.raises(pycoll.ConfigError, match="oops"):
        algorithms.select("allreduce", 2, 100)


def test_info_prints_the_effective_table(monkeypatch, capsys):
    from pycoll.cli import main

    monkeypatch.setenv("PYCOLL_TUNE", "bcast:0-64K:knomial")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "bcast      bytes 0-64K     team any    mem any   -> knomial (PYCOLL_TUNE)" in out
    assert "-> ring (default)" in out and "PYCOLL_TUNE" in out


def test_info_shows_the_choice_for_n_ranks_size_by_size(monkeypatch):
    from pycoll.cli import chosen_by_size

    lines = {line.split()[0]: line for line in chosen_by_size(16)}
    assert lines["scatter"].split(None, 1)[1] == "1-128K shm, 256K-128M cma"
    assert lines["alltoall"].split(None, 1)[1] == "1-128M cma"
    assert lines["barrier"].split() == ["barrier", "shm"]
    alone = {line.split()[0]: line for line in chosen_by_size(1)}
    assert "shm" not in alone["allreduce"]  # one rank: no segment
    monkeypatch.setenv("PYCOLL_TUNE", "allreduce:0-1K:knomial#allreduce:1K-inf:ring")
    lines = {line.split()[0]: line for line in chosen_by_size(16)}
    assert lines["allreduce"].split(None, 1)[1] == "1-512 knomial, 1K-128M ring"


def test_register_an_algorithm_at_run_time(monkeypatch):
    import types

    import numpy as np

    import pycoll
    from pycoll import algorithms

    built = []

    def build(args):
        built.append(args.rank)
        return algorithms.ALGORITHMS["allreduce"]["rd"](args)

    mine = types.ModuleType("mine")
    mine.NAME, mine.COLLECTIVES, mine.OPTIONS, mine.build = "mine", ("allreduce",), {}, build
    try:
        algorithms.register(mine)
        with pytest.raises(ValueError, match="already"):
            algorithms.register(mine)
        monkeypatch.setenv("PYCOLL_TUNE", "allreduce:0-inf:mine")
        teams = pycoll.local_teams(2)
        outs = [np.empty(3) for _ in teams]
        pycoll.wait_all([t.allreduce(np.full(3, t.rank + 1.0), outs[t.rank]) for t in teams])
        assert built == [0, 1] and all((o == 3.0).all() for o in outs)
    finally:
        algorithms.ALGORITHMS["allreduce"].pop("mine", None)
        algorithms.MODULES["allreduce"].pop("mine", None)
    bad = types.ModuleType("bad")
    bad.NAME, bad.COLLECTIVES, bad.OPTIONS, bad.build = "bad", ("allsum",), {}, build
    with pytest.raises(ValueError, match="unknown collective"):
        algorithms.register(bad)


def test_tasks_inside_a_registered_schedule_take_no_credit_of_their_own(monkeypatch):
    """A custom algorithm's schedule of plain Tasks (which take their bytes of credit by default)
    holds the collective's credit once, as a unit: its steps hold none."""
    import types

    import numpy as np

    import pycoll
    from pycoll import algorithms
    from pycoll.tasks import Schedule, Task

    class Copy(Task):  # takes_credit left at its default
        def __init__(self, args):
            super().__init__("copy", nbytes=args.dst.nbytes)
            self.args_ = args

        def post(self):
            self.args_.dst[:] = self.args_.src * self.args_.size  # (every rank gives the same input)
            self.complete()

    def build(args):
        sched = Schedule(name=f"copy@{args.rank}")
        inner = Schedule(name="inner")
        inner.add(Copy(args))
        sched.add(inner)
        return sched

    mine = types.ModuleType("copying")
    mine.NAME, mine.COLLECTIVES, mine.OPTIONS, mine.build = "copying", ("allreduce",), {}, build
    try:
        algorithms.register(mine)
        monkeypatch.setenv("PYCOLL_CHECK", "off")  # (req.task: the collective, not the check's wrapper)
        ctx = pycoll.Context(credit_bytes=1 << 20)
        teams = pycoll.local_teams(2, ctx)
        outs = [np.empty(8) for _ in teams]
        reqs = [t.allreduce(np.ones(8), outs[t.rank], algorithm="copying") for t in teams]
        for req in reqs:
            top = req.task
            assert top.credit == 64 and top.tasks[0].credit == 0 and top.tasks[0].tasks[0].credit == 0
        pycoll.wait_all(reqs)
        assert all((o == 2.0).all() for o in outs) and ctx.in_flight == 0
    finally:
        algorithms.ALGORITHMS["allreduce"].pop("copying", None)
        algorithms.MODULES["allreduce"].pop("copying", None)

