"""pycoll.leftovers against real MPI processes: what a process of a job leaves is the job's even
when nobody looked at it while it lived (``pycoll run``'s jobs are in tests/procs/test_cli.py)."""

import os
import secrets
import signal
import subprocess
import sys
import textwrap

from pycoll.leftovers import JobFiles
from tests.launch import child_env, launched, read_until

SINGLETON = textwrap.dedent("""
    import os, signal, sys, time
    print("READY 0", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    from mpi4py import MPI  # (no launcher: a singleton, whose segment MPICH names after its pid)
    print(f"UP {MPI.COMM_WORLD.rank}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_killed_singletons_segment_is_its_jobs_unseen(tmp_path):
    """A process of the job, looked at once before it started MPI, starts MPI on its own (a
    singleton) and is SIGKILLed: MPICH's segment it leaves, ``mpich_shm_<its pid>_0``, is the
    job's (made while that pid was the job's), though no look ever saw it mapped; removed."""
    go, var, mark = tmp_path / "go", "TESTS_PYCOLL_SINGLETON", secrets.token_hex(4)
    with launched("an MPI singleton") as job:
        files = JobFiles(var, mark)
        proc = subprocess.Popen([sys.executable, "-c", SINGLETON, str(go)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env={**child_env(), **job, var: mark},
                                start_new_session=True)
        read_until(proc, "READY", 1, 60, "the singleton")
        files.sample()  # (the job's process, before MPI)
        go.touch()
        out = read_until(proc, "UP", 1, 60, "the singleton")
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, out
        segment = f"/dev/shm/mpich_shm_{proc.pid:x}_0"
        assert os.path.exists(segment), f"MPICH left no {segment}: {out}"
        assert not files.seen()
        assert files.present() == [segment]
        assert files.remove() == [segment] and not os.path.exists(segment)
