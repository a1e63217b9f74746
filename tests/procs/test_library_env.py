"""The settings pycoll gives the libraries in its processes (pycoll.libenv) reach MPI's UCX: an idle
MPI does not grow with every array the program frees, under ``pycoll run`` and when pycoll is
imported before MPI starts; a value the user sets is kept."""

import re
import sys

import pytest

from tests.launch import ROOT, child_env

SCRIPT = str(ROOT / "tests/procs/scripts/freed_arrays.py")
UNSET = ["UCX_RCACHE_ENABLE"]  # (the test process imported pycoll: its environment has the default)


def growth(out: str) -> float:
    found = re.search(r"GROWTH (-?[\d.]+)", out)
    assert found, out
    return float(found.group(1))


@pytest.fixture
def grows_without_pycoll(run_cmd) -> float:
    """The growth of the same process without pycoll's settings (skips where this MPI's UCX does
    not queue freed regions: then there is nothing to show)."""
    rc, out, err = run_cmd([sys.executable, SCRIPT], timeout=60, env=child_env(drop=UNSET))
    assert rc == 0, out + err
    if growth(out) < 5:
        pytest.skip(f"MPI's UCX here does not grow with freed arrays ({growth(out)} MiB)")
    return growth(out)


def test_pycoll_run_keeps_an_idle_mpi_from_growing_with_freed_arrays(grows_without_pycoll, cli):
    rc, out, err = cli("run", "-n", "1", "--", sys.executable, SCRIPT, timeout=90, env=child_env(drop=UNSET))
    assert rc == 0, out + err
    assert growth(out) < 1.5, f"{growth(out)} MiB under pycoll run, {grows_without_pycoll} MiB without"


def test_importing_pycoll_before_mpi_keeps_it_from_growing(grows_without_pycoll, run_cmd):
    rc, out, err = run_cmd([sys.executable, SCRIPT, "--pycoll-first"], timeout=60, env=child_env(drop=UNSET))
    assert rc == 0, out + err
    assert growth(out) < 1.5, f"{growth(out)} MiB with pycoll first, {grows_without_pycoll} MiB without"


def test_a_setting_the_user_gave_is_kept(run_cmd):
    code = "import os, pycoll; print(os.environ['UCX_RCACHE_ENABLE'])"
    rc, out, err = run_cmd([sys.executable, "-c", code], timeout=60,
                           env=child_env({"UCX_RCACHE_ENABLE": "try"}))
    assert rc == 0 and out.split() == ["try"], out + err
    rc, out, err = run_cmd([sys.executable, "-c", code], timeout=60, env=child_env(drop=UNSET))
    assert rc == 0 and out.split() == ["n"], out + err
