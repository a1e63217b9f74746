"""``pycoll perf`` for every collective, in process: busbw factors and sizes as nccl-tests defines
them, argument errors. The command line and real two-rank runs checked against numpy for pycoll and
MPI: tests/procs/test_perf.py."""

import pytest

from pycoll import perf
from pycoll.cli import build_parser


def perf_args(*argv):
    return build_parser().parse_args(["perf", *argv])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bus_factors_are_nccl_tests(n):
    # (nccl-tests has no scan: scan and exscan move a buffer per rank, busbw = algbw, so that perf
    # sizes them as it does every collective that moves data)
    want = {"allreduce": 2 * (n - 1) / n, "bcast": 1.0, "reduce": 1.0, "barrier": None, "scan": 1.0,
            "exscan": 1.0}
    for coll in ("allgather", "allgatherv", "reduce_scatter", "reduce_scatterv", "alltoall", "alltoallv",
                 "gather", "gatherv", "scatter", "scatterv"):
        want[coll] = (n - 1) / n
    assert set(want) == set(perf.COLLECTIVES)
    for coll, factor in want.items():
        assert perf.COLLS[coll].bus_factor(n) == factor, coll
        fn = perf.BUS_FACTOR[coll]
        assert (fn is None) if factor is None else fn(n) == factor


def test_sizes_of_block_collectives_are_the_n_blocks():
    counts = perf.sizes(8, 64, 4)
    assert counts == [2, 4, 8, 16]
    assert perf.block_counts(perf.COLLS["allreduce"], counts, 3) == counts
    assert perf.block_counts(perf.COLLS["bcast"], counts, 3) == counts
    assert perf.block_counts(perf.COLLS["allgather"], counts, 2) == counts  # divisible: unchanged
    # three ranks: blocks of max(1, count // 3) elements, the same total shown once
    for coll in ("allgather", "reduce_scatterv", "alltoall", "gather", "scatterv"):
        assert perf.block_counts(perf.COLLS[coll], counts, 3) == [3, 6, 15], coll
    assert perf.block_counts(perf.COLLS["barrier"], counts, 2) == [0]


def test_listed_sizes_are_sorted_counts_without_repeats():
    assert perf.listed("4K,8,64K,8", 4) == [2, 1024, 16384]
    assert perf.listed(" 1M , 2", 4) == [1, 262144]  # below one element: one element


def test_argument_errors(monkeypatch):
    def error(*argv):
        with pytest.raises(ValueError) as info:
            perf.validate(perf_args(*argv))
        return str(info.value)

    assert "bcast does not reduce" in error("bcast", "--op", "max")
    reducing = "--op applies to allreduce, reduce, reduce_scatter, reduce_scatterv"
    assert reducing in error("alltoallv", "--op", "sum")
    assert "allreduce has no root" in error("allreduce", "--root", "1")
    assert "--root 2 is not a rank of 2" in error("gather", "--root", "2")
    assert "MPI has no bfloat16" in error("allgather", "--dtype", "bfloat16", "--compare", "mpi")
    assert "BXOR is not defined for float32" in error("reduce_scatterv", "--op", "bxor")
    assert "unknown scatter algorithm 'ring'" in error("scatter", "--algorithm", "ring")
    assert "no sizes" in error("alltoall", "--min-bytes", "1M", "--max-bytes", "4K")
    assert "'4Q' is not a size" in error("allreduce", "--sizes", "8,4Q")
    assert "at least 1 byte" in error("allreduce", "--sizes", "0,4K")
    # several collectives: --op and --root apply to those that take them
    assert perf.validate(perf_args("all", "--op", "max", "--root", "1")) == list(perf.COLLECTIVES)
    assert perf.validate(perf_args("gather", "bcast", "gather")) == ["gather", "bcast"]
    monkeypatch.setitem(perf.COLLS, "barrier", perf.COLLS["barrier"].__class__("barrier", "", "-", "none"))
    assert "MPI has no counterpart of barrier" in error("barrier", "--compare", "mpi")
