"""Run by tests/coll/test_algorithms_mpi.py under mpiexec: bcast scatter_allgather, reduce
rs_gather and gather/scatter(v) knomial over MPI against numpy."""

import numpy as np
from mpi4py import MPI

from pycoll import ReduceOp, Team
from pycoll.ops import DTYPES
from tests.rank import run_rank
from tests.reference import assert_same, expected, make_input


def main():
    team = Team.from_mpi(MPI.COMM_WORLD)
    n, me = team.size, team.rank
    for root in sorted({0, n // 2, n - 1}):
        for count in (0, 1, n + 1, 1000, (1 << 20) + 5):
            # bcast
            want = (np.arange(count, dtype=np.int64) * 31 + root) % 251
            buf = want.astype(np.uint8) if me == root else np.zeros(count, np.uint8)
            team.bcast(buf, root=root, algorithm="scatter_allgather").wait()
            assert np.array_equal(buf, want.astype(np.uint8)), ("bcast", root, count)
            # reduce, out of place and in place
            for dtype, op in (("float32", ReduceOp.SUM), ("int64", ReduceOp.MAX), ("bfloat16", ReduceOp.AVG)):
                ins = [make_input(dtype, op, r, count, seed=count) for r in range(n)]
                mine = ins[me].copy()
                out = np.zeros(count, DTYPES[dtype])
                team.reduce(mine, out if me == root else None, op, root=root, algorithm="rs_gather").wait()
                assert np.array_equal(mine, ins[me]), "reduce wrote its input"
                if me == root:
                    assert_same([out], expected(ins, op), f"reduce {dtype} {op.name} {root=} {count=}")
                team.reduce(mine, None, op, root=root, algorithm="rs_gather").wait()
                if me == root:
                    assert_same([mine], expected(ins, op), f"reduce in place {dtype} root={root}")
            # gather / scatter
            m = count // n
            for radix in (2, 3):
                ins = [np.arange(m, dtype=np.int32) + 7 * r for r in range(n)]
                whole = np.concatenate(ins)
                out = np.zeros(n * m, np.int32)
                team.gather(ins[me], out if me == root else None, root=root, algorithm="knomial",
                            radix=radix).wait()
                if me == root:
                    assert np.array_equal(out, whole), ("gather", root, count, radix)
                got = np.zeros(m, np.int32)
                team.scatter(whole if me == root else None, got, root=root, algorithm="knomial",
                             radix=radix).wait()
                assert np.array_equal(got, ins[me]), ("scatter", root, count, radix)
        # v-forms: unequal counts, reversed displacements
        counts = [(2 * r + 1) % 4 * 3 for r in range(n)]
        displs = list(np.cumsum([0] + counts[::-1][:-1])[::-1])
        room = sum(counts)
        ins = [np.full(counts[r], r + 1.0) for r in range(n)]
        want = np.zeros(room)
        for r in range(n):
            want[displs[r]:displs[r] + counts[r]] = ins[r]
        out = np.zeros(room)
        team.gatherv(ins[me], out if me == root else None, counts, displs, root=root,
                     algorithm="knomial").wait()
        if me == root:
            assert np.array_equal(out, want), ("gatherv", root)
        got = np.zeros(counts[me])
        team.scatterv(want if me == root else None, got, counts, displs, root=root,
                      algorithm="knomial").wait()
        assert np.array_equal(got, ins[me]), ("scatterv", root)


run_rank(main)
