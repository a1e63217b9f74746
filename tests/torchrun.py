"""Launching torch.distributed ranks from tests, three ways, each with a wall-clock limit and the
failing rank named, no process left behind:

* ``env``: what torchrun hands its workers (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK)
  set directly on ``n`` processes: ``init_process_group`` rendezvous through env:// and its store;
* ``torchrun``: the real launcher (``python -m torch.distributed.run``);
* ``mpiexec``: the bundled mpiexec; ``import pycoll.torch`` fills in the env:// variables.

Scripts print ``RANK <r> OK`` when they pass (see ``tests/torch/common.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from tests.mpirun import ROOT, _ok_ranks, mpiexec

pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env(extra: dict | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **(extra or {}))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if extra is None or var not in extra:
            env.pop(var, None)
    return env


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run_torch(n: int, script: str, *args: str, launcher: str = "env", timeout: float = 120,
              env: dict | None = None) -> str:
    """Run ``python script args`` as ``n`` torch ranks started by ``launcher``; fail the test
    naming the ranks that did not print ``RANK r OK``. Returns the combined output."""
    base = _base_env(env)
    base.setdefault("PYCOLL_TIMEOUT", str(max(10, timeout - 10)))
    path = str(ROOT / script)
    if launcher == "env":
        port = free_port()
        procs, files = [], []
        for r in range(n):
            f = tempfile.TemporaryFile("w+")
            rank_env = dict(base, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen([sys.executable, "-u", path, *args], stdout=f,
                                          stderr=subprocess.STDOUT, env=rank_env, start_new_session=True,
                                          cwd=str(ROOT)))
            files.append(f)
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
        finally:
            for p in procs:
                _kill(p)
        outs = []
        for f in files:
            f.seek(0)
            outs.append(f.read())
            f.close()
        out = "".join(f"--- rank {r} ---\n{o}" for r, o in enumerate(outs))
        codes = [p.returncode for p in procs]
    else:
        if launcher == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
                   f"--master-port={free_port()}", "--master-addr=127.0.0.1", path, *args]
        elif launcher == "mpiexec":
            cmd = [mpiexec(), "-n", str(n), sys.executable, "-u", path, *args]
        else:
            raise ValueError(f"unknown launcher {launcher!r}")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=base,
                                start_new_session=True, cwd=str(ROOT))
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc)
            out, _ = proc.communicate()
        finally:
            _kill(proc)
        codes = [proc.returncode]
    ok = _ok_ranks(out)
    missing = sorted(set(range(n)) - ok)
    if timed_out:
        pytest.fail(f"{script} ({launcher}, {n} ranks) did not finish within {timeout} s; ranks not done: "
                    f"{missing}\n{out[-6000:]}")
    if missing or any(codes):
        pytest.fail(f"{script} ({launcher}, {n} ranks): exit codes {codes}, failed ranks {missing}\n"
                    f"{out[-6000:]}")
    return out
