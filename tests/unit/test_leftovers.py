"""pycoll.leftovers' foresight of MPICH's names: glibc's rand() as Hydra's mpiexec draws it, and a
job's world id from its kvs name (the launches that check it against real jobs are in
tests/procs/test_cli.py)."""

import ctypes
import ctypes.util
import random

import pytest

from pycoll.leftovers import glibc_rand, hydra_world_ids, mpich_world_id


def test_glibc_rand_is_libcs():
    """The same values as the C library's ``srand(seed); rand()`` for seeds of every kind (0, the
    int32 edge, today's seconds, random ones)."""
    name = ctypes.util.find_library("c")
    if name is None or "libc.so" not in name:
        pytest.skip(f"not glibc: {name}")
    libc = ctypes.CDLL(name)
    libc.srand.argtypes = [ctypes.c_uint]
    seeds = [0, 1, 2, 12345, 1795939910, 2**31 - 1, 2**31, 2**31 + 5, 2**32 - 1]
    seeds += [random.randrange(2**32) for _ in range(50)]
    for seed in seeds:
        libc.srand(seed)
        assert glibc_rand(seed, 4) == [libc.rand() for _ in range(4)], seed


def test_world_ids_of_a_hydra_job():
    """A job seen on a host named ``vm``: mpiexec pid 6842, started in second 1795939910, left
    ``/dev/shm/mpich_shm_7fc20f7f_0``; its neighbours' seconds give other ids."""
    assert mpich_world_id("") == 2166136261
    assert "7fc20f7f" in hydra_world_ids(6842, 1795939910, 1795939910, host="vm")
    assert "7fc20f7f" not in hydra_world_ids(6842, 1795939909, 1795939909, host="vm")
    assert "7fc20f7f" not in hydra_world_ids(6843, 1795939910, 1795939910, host="vm")
    assert len(hydra_world_ids(6842, 1795939900, 1795939919, host="vm", groups=1)) == 20
