"""pycoll sim --payload: the programs of every simulated algorithm, run with data on 64 ranks,
leave every rank with numpy's result, in the same simulated time as without data; a program that
skips a reduction is caught; the CLI reports it per row."""

import pytest

from pycoll.cli import main as cli
from pycoll.sim import Machine, programs, run
from pycoll.sim.cli import ALL
from pycoll.sim.payload import Payload
from pycoll.sim.programs import COMPOSITES

CASES = [(c, a) for c, algs in ALL.items() for a in algs if (c, a) not in COMPOSITES]
M = Machine(alpha=2e-6, bandwidth=10e9, reduce_bw=5e9)


@pytest.mark.parametrize("coll,alg", CASES)
def test_every_rank_ends_with_numpys_result(coll, alg):
    data = Payload(coll, alg, 64, 64 * 64)
    res = run(data.compacts, M, payload=data)
    assert not res.unmatched and data.wrong() == []
    assert res.time == pytest.approx(run(programs(coll, alg, 64, 64 * 64), M).time)


def test_a_skipped_reduction_is_caught():
    data = Payload("allreduce", "rd", 8, 4096)
    begin = data.begin

    def skip_rank_3s_reductions(r, i):
        if not (r == 3 and data.programs[r].instrs[i].kind == "reduce"):
            begin(r, i)
    data.begin = skip_rank_3s_reductions
    run(data.compacts, M, payload=data)
    assert "rank 3" in data.wrong()


def test_the_cli(capsys):
    assert cli(["sim", "allreduce", "-n", "16", "--algorithm", "rd,ring", "--min-bytes", "8",
                "--max-bytes", "1K", "--payload"]) == 0
    out = capsys.readouterr().out
    assert out.count("payload: right on every rank") == 4 and "WRONG" not in out  # (8 B to 512 B)
    assert "ring cannot be simulated: --payload" in out
