"""BytePS's traffic formula (OSDI'20, section 4.1) and ``pycoll perf push_pull``'s arguments, in
process: a worker sends and receives ``M + (n-2)*M_gpu`` bytes per iteration, a server ``n*M_cpu``,
with ``M_gpu = (n-k)M/(n^2+kn-2k)`` and ``M_cpu = 2(n-1)M/(n^2+kn-2k)``. Measured on real ranks:
tests/procs/test_push_pull_perf.py."""

import pytest

from pycoll import perf
from tests.unit.test_perf import perf_args


def test_formula_is_bytepss():
    m = 1 << 20
    for n in (2, 3, 4, 8):
        f = perf.byteps_traffic(n, 0, m)  # k = 0: all-reduce
        assert f["worker"] == pytest.approx(2 * (n - 1) * m / n) and f["server"] is None
        f = perf.byteps_traffic(n, n, m)  # k = n: a plain PS, every byte through the servers once
        assert f["m_gpu"] == 0 and f["worker"] == pytest.approx(m) and f["server"] == pytest.approx(m)
    f = perf.byteps_traffic(4, 1, m)
    assert f["m_gpu"] == pytest.approx(3 * m / 18) and f["m_cpu"] == pytest.approx(6 * m / 18)
    assert f["worker"] == pytest.approx(m + 2 * 3 * m / 18) and f["server"] == pytest.approx(4 * 6 * m / 18)
    # the paper's example: n = 32, k = 16 is 1.46x faster than all-reduce (times ~ the busiest NIC)
    assert perf.byteps_traffic(32, 0, m)["worker"] / perf.byteps_traffic(32, 16, m)["worker"] == \
        pytest.approx(1.46875)
    assert perf.byteps_traffic(2, 5, m)["server"] == pytest.approx(2 * m / 5)  # k > n: servers share evenly


def test_push_pull_arguments():
    def error(*argv):
        with pytest.raises(ValueError) as info:
            perf.validate(perf_args(*argv))
        return str(info.value)

    assert "--servers applies to push_pull" in error("allreduce", "--servers", "1")
    assert "push_pull sums" in error("push_pull", "--op", "max")
    assert "push_pull has no algorithms" in error("push_pull", "--algorithm", "ring")
    assert "--servers must be >= 0" in error("push_pull", "--servers", "-1")
    assert perf.validate(perf_args("push_pull", "--op", "avg", "--servers", "2")) == ["push_pull"]
    assert "push_pull" not in perf.validate(perf_args("all"))  # all: the collectives without servers
    assert perf.validate(perf_args("allreduce", "push_pull", "--servers", "1")) == ["allreduce", "push_pull"]
