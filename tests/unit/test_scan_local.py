"""scan and exscan (recursive doubling) on in-process teams of every size up to 9: every rank's
prefix in rank order, in place and not, tagged, repeated on the same task."""

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp
from pycoll.ops import reference as reduce_reference
from tests.reference import make_input


@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("coll", ["scan", "exscan"])
def test_prefix_reductions(n, coll):
    teams = pycoll.local_teams(n)
    for op, dtype in ((ReduceOp.SUM, "int64"), (ReduceOp.MAX, "float32"), (ReduceOp.PROD, "float64"),
                      (ReduceOp.BXOR, "uint16")):
        for count in (0, 1, 33):
            ins = [make_input(dtype, op, r, count, seed=n) for r in range(n)]
            for in_place in (False, True):
                for tag in (None, ("t", count)):
                    outs = [x.copy() if in_place else np.full(count, 7, x.dtype) for x in ins]
                    reqs = [getattr(t, coll)(outs[r] if in_place else ins[r], None if in_place else outs[r],
                                             op, tag=tag) for r, t in enumerate(teams)]
                    pycoll.wait_all(reqs)
                    for r in range(n):
                        lo = ins[:r + 1] if coll == "scan" else ins[:r]
                        if not lo:  # exscan's rank 0: left as it was
                            want = ins[0] if in_place else np.full(count, 7, ins[0].dtype)
                        else:
                            want = reduce_reference([x.copy() for x in lo], op)
                        assert np.array_equal(outs[r], want), (coll, n, op, dtype, count, in_place, tag, r)


def test_avg_is_refused_before_anything_is_sent():
    team = pycoll.local_teams(1)[0]
    with pytest.raises(ValueError, match="AVG"):
        team.scan(np.ones(3), op="avg")
    with pytest.raises(ValueError, match="AVG"):
        team.exscan(np.ones(3), op=ReduceOp.AVG)
