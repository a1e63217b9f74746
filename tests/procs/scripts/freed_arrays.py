"""Frees 100,000 arrays that glibc maps on their own (256 KiB, with its mmap threshold fixed at
128 KiB: each is unmapped when freed) in a process whose MPI is up and idle, and prints how much
the process's resident memory grew: ``GROWTH <MiB>``. With ``--pycoll-first`` pycoll is imported
before MPI starts."""

import ctypes
import sys

if "--pycoll-first" in sys.argv:
    import pycoll  # noqa: F401

import numpy as np
from mpi4py import MPI  # noqa: F401  (MPI starts here: its UCX reads the environment)


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


ctypes.CDLL(None).mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD
before = resident()
for _ in range(100_000):
    a = np.empty(256 << 10, np.uint8)
    del a
print(f"GROWTH {(resident() - before) / 2**20:.1f}", flush=True)
