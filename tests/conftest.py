"""What every test shares: the markers of the three kinds, the launch fixtures, and the task kinds
of the engine tests.

Markers (registered in pyproject.toml) are applied here, so no test file needs a decorator:

* by directory: tests/unit -> ``unit``, tests/coll -> ``coll``, tests/procs -> ``procs``,
  tests/procs/torch -> ``torch`` (skipped, saying why, where torch is not installed);
* ``procs`` also on every test that takes a launch fixture (``mpirun``, ``torchrun``, ``hosts``,
  ``store_ranks``, ``cli``, ``run_cmd``: tests/launch.py's launchers) wherever it lives, and on the
  long in-process sweeps listed in ``SLOW``, so that ``-m "not procs"`` is the fast part;
* ``many`` on the launches of many more ranks than cores listed in ``MANY`` (``-m "not many"``
  skips them locally; CI runs everything).

The task kinds are imported by the tests that use them: ``from tests.conftest import Manual``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pycoll import Task
from tests import launch

HERE = Path(__file__).resolve().parent
KINDS = ("unit", "coll", "procs")
LAUNCH_FIXTURES = frozenset({"mpirun", "torchrun", "hosts", "store_ranks", "cli", "run_cmd"})
#: in-process tests of several seconds each (measured on the 2-core VM): marked ``procs`` so that
#: ``-m "not procs"`` stays under a minute. ``path::name`` covers every parametrization,
#: ``path::name[id]`` one.
SLOW = frozenset({
    "unit/test_allreduce_local.py::test_large_count_every_dtype_and_op",  # 3 x 5-11 s
    "unit/test_allreduce_local.py::test_team_sizes[64-ring]",  # 3 s
    "coll/test_matrix.py::test_matrix_large_local_teams",  # 1-10 s
    *(f"coll/test_matrix.py::test_matrix_local[{n}]" for n in (5, 6, 7, 8)),  # 2-4 s each
})


#: tests of many more ranks than cores (a minute or more on 2 cores): marked ``many`` as well, so
#: that ``-m "not many"`` skips them locally; CI runs them.
MANY = frozenset({
    "coll/test_matrix.py::test_matrix_many_processes[64]",  # 75-90 s
})


def _slow(rel: str, item: pytest.Item) -> bool:
    """Whether ``item`` (in tests/``rel``) is listed in ``SLOW``, by name or with its parameters."""
    name = getattr(item, "originalname", item.name)
    return f"{rel}::{name}" in SLOW or f"{rel}::{item.name}" in SLOW


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Mark every test with its kind (by directory), ``procs`` where it starts processes or runs
    long, ``torch`` under tests/procs/torch (skipped, saying why, without torch)."""
    try:
        no_torch = importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):  # a broken or blocked torch
        no_torch = True
    for item in items:
        try:
            parts = Path(str(item.path)).resolve().relative_to(HERE).parts
        except ValueError:  # not under tests/
            continue
        rel = "/".join(parts)
        if len(parts) > 1 and parts[0] in KINDS:
            item.add_marker(parts[0])
        launches = LAUNCH_FIXTURES & set(getattr(item, "fixturenames", ()))
        if parts[0] != "procs" and (launches or _slow(rel, item)):
            item.add_marker("procs")
        if f"{rel}::{item.name}" in MANY:
            item.add_marker("many")
        if parts[:2] == ("procs", "torch"):
            item.add_marker("torch")
            if no_torch:
                item.add_marker(pytest.mark.skip(reason="torch is not installed (pip install torch==2.13.0)"))


@pytest.fixture
def no_agreement_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PYCOLL_CHECK=off`` (here and in the processes a test launches): for the tests that count
    messages, bytes or trace spans, or look inside a request's task, which the agreement check of
    the first collectives of a team (pycoll.agreement: a fingerprint exchange before the call)
    would add to or wrap. The check itself is tested in tests/unit/test_agreement.py and by
    tests/procs/test_shm.py's mismatch tests."""
    monkeypatch.setenv("PYCOLL_CHECK", "off")


# ------------------------------------------------------------------ launch fixtures (tests/launch.py)
@pytest.fixture
def mpirun():
    """``mpirun(n, script, *args, timeout=, env=, groups=)``: ranks under mpiexec (launch.run_ranks)."""
    return launch.run_ranks


@pytest.fixture
def torchrun():
    """``torchrun(n, script, *args, launcher=, timeout=, env=)``: torch ranks (launch.run_torch)."""
    return launch.run_torch


@pytest.fixture
def hosts():
    """``hosts(script, per_host, *args, timeout=, env=)``: ranks in two network namespaces
    (launch.run_hosts)."""
    return launch.run_hosts


@pytest.fixture
def store_ranks():
    """``store_ranks(script, size, *args, timeout=, env=)``: ``python -c`` ranks around a TCPStore
    (launch.run_store_ranks) -> (exit codes, outputs)."""
    return launch.run_store_ranks


@pytest.fixture
def cli():
    """``cli(*args, timeout=, cwd=, env=)``: ``python -m pycoll.cli`` (launch.pycoll_cli)
    -> (rc, out, err)."""
    return launch.pycoll_cli


@pytest.fixture
def run_cmd():
    """``run_cmd(cmd, timeout=, env=, cwd=, merge=, what=)``: any command in its own process group
    (launch.run_command) -> (rc, out, err)."""
    return launch.run_command


# ------------------------------------------------------------------ task kinds of the engine tests
class Manual(Task):
    """Stays in progress until the test calls ``finish()``; records when it starts."""

    def __init__(self, name, log=None, **kw):
        super().__init__(name, **kw)
        self.log = log
        self.finish_now = False

    def post(self):
        if self.log is not None:
            self.log.append(self.name)
        self.progress()

    def progress(self):
        if self.finish_now:
            self.complete()

    def finish(self):
        self.finish_now = True

    def reset(self):
        super().reset()
        self.finish_now = False


class Recorder(Task):
    """Completes at once, appending its name to ``log``."""

    def __init__(self, name, log, **kw):
        super().__init__(name, **kw)
        self.log = log

    def post(self):
        self.log.append(self.name)
        self.complete()


class Boom(Task):
    """Raises from post (``when="post"``) or from the first progress call."""

    def __init__(self, name="boom", when="post", exc=None, **kw):
        super().__init__(name, **kw)
        self.when = when
        self.exc = exc or RuntimeError(f"{name} exploded")

    def post(self):
        if self.when == "post":
            raise self.exc

    def progress(self):
        raise self.exc
