"""Launching ranks with the mpiexec that the ``mpich`` wheel installs next to Python."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import List, Optional

from pycoll.errors import PycollError


def find_mpiexec() -> str:
    """The bundled mpiexec (next to this Python), else one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec")
    if found:
        return found
    raise PycollError("mpiexec not found: install the mpich wheel (pip install mpich)")


def under_mpi() -> bool:
    """Whether this process was started by an MPI launcher (so MPI's world has the other ranks)."""
    return any(v in os.environ for v in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"))


def launch(n: int, cmd: List[str], timeout: Optional[float] = None, env: Optional[dict] = None,
           servers: int = 0) -> int:
    """Run ``cmd`` on ``n`` ranks (and ``servers`` push-pull summation servers after them, running
    ``python -m pycoll.ps.server``, with ``PYCOLL_NUM_SERVERS`` set for all); return the exit
    status. With ``timeout`` (seconds) every rank is killed when it passes, and the status is 124."""
    if n < 1:
        raise PycollError(f"-n must be >= 1, got {n}")
    if servers < 0:
        raise PycollError(f"--servers must be >= 0, got {servers}")
    argv = [find_mpiexec(), "-n", str(n), *cmd]
    env = dict(env or {})
    if servers:
        argv += [":", "-n", str(servers), sys.executable, "-m", "pycoll.ps.server"]
        env["PYCOLL_NUM_SERVERS"] = str(servers)
    proc = subprocess.Popen(argv, env=dict(os.environ, **env), start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"pycoll: ranks did not finish within {timeout:g} s; killing them", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 124
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        return 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
