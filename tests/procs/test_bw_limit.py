"""PYCOLL_BW_LIMIT in real processes: the measured throughput over tcp, shm and mpi is close to
the limit. The token bucket itself and in-process teams: tests/unit/test_bw_limit.py."""

import re


def test_processes_tcp_shm_mpi(mpirun):
    """2 ranks, 20 MiB/s: rank 0 streams 10 MiB to rank 1 over tcp, shm and mpi (throughput within
    0.6..1.1 of the limit), and tagged (and untagged, over mpi) allreduces take their time."""
    out = mpirun(2, "tests/procs/scripts/bw_limit.py", timeout=90, env={"PYCOLL_BW_LIMIT": "20MB"})
    lines = re.findall(r"BW (\w+) limit (\d+) measured (\d+)", out)
    assert sorted(name for name, _, _ in lines) == ["mpi", "shm", "tcp"], out
    for name, limit, measured in lines:
        print(f"{name}: limit {int(limit) / 1e6:.2f} MB/s, measured {int(measured) / 1e6:.2f} MB/s")
