"""Traffic accounting over real transports: 4 processes check the ring allreduce's 2(n-1)/n*M per
rank over mpi, tcp, shm and ucx (tests/procs/scripts/traffic.py). In process:
tests/unit/test_traffic.py."""

import re

import pytest

# (they count messages, bytes or spans, or look inside a request's task: see the fixture)
pytestmark = pytest.mark.usefixtures("no_agreement_check")


def test_processes_mpi_tcp_shm_ucx(mpirun):
    """4 ranks: the ring figure over every transport (tagged and untagged), recursive doubling's
    exchanges over MPI, oversized receives (see tests/procs/scripts/traffic.py)."""
    out = mpirun(4, "tests/procs/scripts/traffic.py", timeout=60)
    lines = re.findall(r"TRAFFIC (\w+) ring", out)
    assert {"mpi", "tcp"} <= set(lines), out
    for line in re.findall(r"(?:TRAFFIC|SKIP) [^\n]*", out):
        print(line)
