"""Run under mpiexec by tests/coll/test_algorithms_mpi.py: the point-to-point block algorithms
(allgather rd/bruck, reduce_scatter rhalving, alltoall bruck) over MPI in real processes, vs numpy."""

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import ReduceOp, Team
from pycoll.ops import DTYPES
from tests.rank import run_rank
from tests.reference import assert_same, expected, make_input


def main():
    team = Team.from_mpi(MPI.COMM_WORLD)
    n, r = team.size, team.rank
    for count in (0, 1, 7, 1000):
        ins = [make_input("float32", ReduceOp.SUM, rr, count, seed=count) for rr in range(n)]
        want = np.concatenate(ins)
        for alg in ("rd", "bruck"):
            out = np.full(n * count, 99, np.float32)
            team.allgather(ins[r], out, algorithm=alg).wait()
            assert_same([out], want, f"allgather {alg} count={count}")
            out = np.full(n * count, 99, np.float32)
            out[r * count:(r + 1) * count] = ins[r]
            team.allgather(None, out, algorithm=alg).wait()
            assert_same([out], want, f"allgather in place {alg} count={count}")
        for dtype, op in (("float32", ReduceOp.SUM), ("int64", ReduceOp.MAX), ("bfloat16", ReduceOp.AVG),
                          ("float16", ReduceOp.PROD)):
            whole = [make_input(dtype, op, rr, n * count, seed=count + 1) for rr in range(n)]
            out = np.full(count, 99, DTYPES[dtype])
            team.reduce_scatter(whole[r], out, op, algorithm="rhalving").wait()
            assert_same([out], expected(whole, op)[r * count:(r + 1) * count],
                        f"reduce_scatter rhalving {dtype} {op.name} count={count}")
        send = (np.arange(n * count) + 10000 * r).astype(np.int64)
        out = np.full(n * count, -1, np.int64)
        team.alltoall(send, out, algorithm="bruck").wait()
        every = [np.arange(n * count) + 10000 * s for s in range(n)]
        assert np.array_equal(out, np.concatenate([every[s][r * count:(r + 1) * count] for s in range(n)])
                              if count else out), f"alltoall bruck count={count}"
    # v-layouts: unequal blocks, an empty one, gaps and reverse rank order
    counts = [(3 * k + 1) % 5 + 100 * (k == n - 1) for k in range(n)]
    gaps = [sum(counts[:k]) + 5 * k + 2 for k in range(n)]
    for displs in (None, gaps, [sum(counts[k + 1:]) for k in range(n)]):
        offs = displs if displs is not None else [sum(counts[:k]) for k in range(n)]
        room = max(o + c for o, c in zip(offs, counts)) + 1
        ins = [np.arange(counts[rr], dtype=np.float64) + 1000 * rr for rr in range(n)]
        want = np.full(room, -7.0)
        for rr in range(n):
            want[offs[rr]:offs[rr] + counts[rr]] = ins[rr]
        for alg in ("rd", "bruck"):
            out = np.full(room, -7.0)
            team.allgatherv(ins[r], out, counts, displs, algorithm=alg).wait()
            assert_same([out], want, f"allgatherv {alg} displs={displs}")
    whole = [make_input("int64", ReduceOp.SUM, rr, sum(counts), seed=5) for rr in range(n)]
    out = np.zeros(counts[r], np.int64)
    team.reduce_scatterv(whole[r], out, counts, algorithm="rhalving").wait()
    off = sum(counts[:r])
    assert_same([out], expected(whole, ReduceOp.SUM)[off:off + counts[r]], "reduce_scatterv rhalving")
    # several in flight at once, completed in reverse order
    reqs, outs = [], []
    for k in range(4):
        outs.append(np.zeros(n * 50))
        reqs.append(team.allgather(np.full(50, r + k, float), outs[-1], algorithm=("rd", "bruck")[k % 2]))
        outs.append(np.zeros(50))
        reqs.append(team.reduce_scatter(np.full(n * 50, r + k, float), outs[-1], algorithm="rhalving"))
    pycoll.wait_all(list(reversed(reqs)))
    for k in range(4):
        assert (outs[2 * k] == np.repeat(np.arange(n) + k, 50)).all(), k
        assert (outs[2 * k + 1] == sum(rr + k for rr in range(n))).all(), k


if __name__ == "__main__":
    run_rank(main)
