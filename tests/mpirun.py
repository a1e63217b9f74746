"""Launching real multi-process runs from tests: a wall-clock limit on every launch, the failing
rank named, no processes left behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def mpiexec() -> str:
    exe = Path(sys.executable).parent / "mpiexec"
    if exe.exists():
        return str(exe)
    found = shutil.which("mpiexec")
    if not found:
        pytest.skip("mpiexec not found (pip install mpich)")
    return found


def _ok_ranks(out: str) -> set:
    # mpiexec may interleave the ranks' output mid-line: match the markers anywhere
    return {int(m) for m in re.findall(r"RANK (\d+) OK", out)}


def run_ranks(n: int, script: str, *args: str, timeout: float = 120, env: dict | None = None,
              groups: list | None = None) -> str:
    """Run ``python script args`` on ``n`` ranks; fail the test naming the rank(s) that failed.

    Each rank prints ``RANK <r> OK`` when it passes; anything else is reported with its output.
    ``groups``: ``[(count, {VAR: value}), ...]`` gives successive blocks of ranks their own
    environment (mpiexec's MPMD form), e.g. a PYCOLL_NODE_ID per block.
    """
    prog = [sys.executable, "-u", str(ROOT / script), *args]
    if groups is None:
        cmd = [mpiexec(), "-n", str(n), *prog]
    else:
        assert sum(c for c, _ in groups) == n, groups
        cmd = [mpiexec()]
        for i, (count, block_env) in enumerate(groups):
            cmd += [":"] if i else []
            cmd += ["-n", str(count)]
            for var, value in block_env.items():
                cmd += ["-env", var, str(value)]
            cmd += prog
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    full_env.setdefault("PYCOLL_TIMEOUT", str(max(10, timeout - 10)))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True, cwd=str(ROOT))
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        ok = {int(line.split()[1]) for line in out.splitlines() if line.startswith("RANK ") and "OK" in line}
        missing = sorted(set(range(n)) - ok)
        pytest.fail(f"{script} on {n} ranks did not finish within {timeout} s; ranks not done: "
                    f"{missing}\n{out[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ok = _ok_ranks(out)
    if proc.returncode != 0 or ok != set(range(n)):
        failed = sorted(set(range(n)) - ok)
        pytest.fail(f"{script} on {n} ranks: exit {proc.returncode}, failed ranks {failed}\n{out[-6000:]}")
    return out
