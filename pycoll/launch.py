"""Launching ranks with the mpiexec that the ``mpich`` wheel installs next to Python, and ending
them cleanly: on a timeout or Ctrl-C the ranks are interrupted, given a moment, then killed, and
the shared-memory files MPICH left in ``/dev/shm`` (and the topology file its launcher's proxy
keeps in the temporary directory) are removed (pycoll's own segments are memfds, which never
appear there)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional, Set

from pycoll import config
from pycoll.errors import PycollError


def find_mpiexec() -> str:
    """``PYCOLL_MPIEXEC`` where set, else the bundled mpiexec (next to this Python), else one on PATH."""
    named = config.get("PYCOLL_MPIEXEC")
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise PycollError(f"PYCOLL_MPIEXEC={named} is not an executable file")
        return named
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec")
    if found:
        return found
    raise PycollError("mpiexec not found: install the mpich wheel (pip install mpich)")


#: How ``launch`` places ranks on cores (``pycoll run/perf --bind``).
BIND_CHOICES = ("none", "core", "auto")


def pinnable_cores() -> int:
    """How many ranks ``bind="auto"`` pins: the physical cores of this machine (hardware threads of
    one core counted once: ``-bind-to core`` gives each rank a whole core), or 0 when this process
    may not use every CPU (a ``taskset`` or a batch system's share: mpiexec would pin ranks to
    cores outside it, perhaps another job's)."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < (os.cpu_count() or 0):
        return 0
    cores = set()
    for cpu in allowed:
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topo}/physical_package_id") as f, open(f"{topo}/core_id") as g:
                cores.add((f.read().strip(), g.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))  # (no topology: each CPU a core)
    return len(cores)


def under_mpi() -> bool:
    """Whether this process was started by an MPI launcher (so MPI's world has the other ranks)."""
    return any(v in os.environ for v in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"))


def launch(n: int, cmd: List[str], timeout: Optional[float] = None, env: Optional[dict] = None,
           servers: int = 0, bind: str = "none") -> int:
    """Run ``cmd`` on ``n`` ranks (and ``servers`` push-pull summation servers after them, running
    ``python -m pycoll.ps.server``, with ``PYCOLL_NUM_SERVERS`` set for all); return the exit
    status. With ``timeout`` (seconds) every rank is killed when it passes, and the status is 124.
    ``bind="core"`` pins each process to a core of its own (mpiexec's ``-bind-to core``); "auto"
    does where :func:`pinnable_cores` has room for them all, else leaves them free. SIGTERM to this
    process ends the ranks too (status 143) when ``launch`` runs in the main thread (Python takes
    signals there only); a SIGTERM handler of the caller's is set again afterwards, not called."""
    if n < 1:
        raise PycollError(f"-n must be >= 1, got {n}")
    if servers < 0:
        raise PycollError(f"--servers must be >= 0, got {servers}")
    if bind not in BIND_CHOICES:
        raise PycollError(f"bind={bind!r}: one of {', '.join(BIND_CHOICES)}")
    if bind == "auto":
        bind = "core" if n + servers <= pinnable_cores() else "none"
    argv = [find_mpiexec(), *(["-bind-to", "core"] if bind == "core" else []), "-n", str(n), *cmd]
    env = dict(env or {})
    if servers:
        argv += [":", "-n", str(servers), sys.executable, "-m", "pycoll.ps.server"]
        env["PYCOLL_NUM_SERVERS"] = str(servers)
    before = mpich_files()
    job = f"{os.getpid()}.{time.monotonic_ns()}"
    env[JOB_VAR] = job  # every rank carries it, whichever session mpiexec starts it in
    proc = subprocess.Popen(argv, env=dict(os.environ, **env), start_new_session=True)
    used: Set[str] = set()  # the /dev/shm files the job's processes used when it was ended
    # SIGTERM (kill, an outer timeout, a batch system) ends the ranks too: they run in sessions of
    # their own, so nothing else would reach them
    # (not where a handler set from C is there: Python could not set it again afterwards)
    main = threading.current_thread() is threading.main_thread()
    main = main and signal.getsignal(signal.SIGTERM) is not None
    old = signal.signal(signal.SIGTERM, _terminated) if main else None
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"pycoll: ranks did not finish within {timeout:g} s; ending them", file=sys.stderr)
        used = end_job(proc, job)
        return 124
    except KeyboardInterrupt:
        used = end_job(proc, job)
        return 130
    except Terminated:
        print("pycoll: terminated; ending the ranks", file=sys.stderr)
        used = end_job(proc, job)
        return 143
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)
        if proc.poll() is None or job_processes(job):  # (an exception here, or ranks left behind)
            used |= end_job(proc, job)
        remove_left_behind(before, used)


class Terminated(Exception):
    """The launcher received SIGTERM while its ranks ran."""


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (a second one, even before ``except`` runs: ignored)
    raise Terminated()


#: Where MPICH keeps its shared memory (``mpich_shm_*``), and how long ranks may take to end
#: themselves after SIGINT (their ``finally`` blocks and atexit handlers run) before SIGKILL.
MPICH_SHM = "/dev/shm/mpich_shm_*"
GRACE_S = 2.0
#: The machine's topology that MPICH's launcher (Hydra's proxy) writes for ranks that start MPI and
#: removes when it ends itself: left behind where it is killed.
HYDRA_TOPOLOGY = os.path.join(tempfile.gettempdir(), "hydra_hwloc_xmlfile_")
#: The environment variable that marks a job's processes (mpiexec starts its proxies and ranks in
#: sessions of their own: the launcher's process group does not hold them).
JOB_VAR = "PYCOLL_JOB"


def job_processes(job: str) -> List[int]:
    """The processes (but this one) whose environment says they belong to ``job``."""
    mark = f"{JOB_VAR}={job}\0".encode()
    pids = []
    for entry in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(entry, "rb") as f:
                if mark in f.read():
                    pids.append(int(entry.split("/")[2]))
        except (OSError, ValueError):
            continue
    return [p for p in pids if p != os.getpid()]


def _signal(pids: List[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_job(proc: subprocess.Popen, job: str, grace: float = GRACE_S) -> Set[str]:
    """End mpiexec (``proc``) and every process of ``job``: SIGINT (Python ranks unwind, tell
    their peers they left, and may finalize), then, after ``grace`` seconds or once they are gone,
    SIGKILL, until none is left (a few seconds at most). A second Ctrl-C skips the wait. Returns
    the /dev/shm files the job's processes mapped or held open before they were signalled."""
    pids = job_processes(job)
    used = shm_used_by(pids)
    if proc.poll() is None:  # (a reaped launcher's pid may be another process's by now)
        pids.append(proc.pid)
    _signal(pids, signal.SIGINT)
    deadline = time.monotonic() + grace
    try:
        while time.monotonic() < deadline and (proc.poll() is None or job_processes(job)):
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    deadline = time.monotonic() + 5.0
    while True:
        left = [p for p in job_processes(job) if p != proc.pid]
        if proc.poll() is None:
            left.append(proc.pid)
        if not left or time.monotonic() > deadline:
            break
        _signal(left, signal.SIGKILL)
        time.sleep(0.02)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return used


def mpich_files() -> Set[str]:
    """MPICH's shared-memory files in /dev/shm, and its launcher's topology files, that belong to
    this user."""
    uid = os.getuid()
    found = set()
    for path in glob.glob(MPICH_SHM) + glob.glob(HYDRA_TOPOLOGY + "*"):
        try:
            if os.stat(path).st_uid == uid:
                found.add(path)
        except OSError:
            pass
    return found


def shm_used_by(pids: Optional[List[int]] = None) -> Set[str]:
    """The /dev/shm files (and MPICH's launcher's topology files) the processes ``pids`` (None:
    every process) map or hold open."""
    if pids is None:
        procs = [entry.split("/")[2] for entry in glob.glob("/proc/[0-9]*")]
    else:
        procs = [str(p) for p in pids]
    used = set()
    for pid in procs:
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                for line in f:
                    at = line.find(b"/dev/shm/")
                    if at >= 0:
                        used.add(line[at:].split(b" (deleted)")[0].strip().decode(errors="replace"))
        except OSError:
            pass
        for fd in glob.glob(f"/proc/{pid}/fd/*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("/dev/shm/") or target.startswith(HYDRA_TOPOLOGY):
                used.add(target)
    return used


def remove_left_behind(before: Set[str], used: Set[str]) -> List[str]:
    """Remove the MPICH shared-memory (and topology) files of an ended job: those its processes
    ``used`` (read before they were ended), that appeared since ``before`` and that no live process
    uses any more (another job's files are never among them); returns their paths."""
    new = (mpich_files() - before) & used
    if not new:
        return []
    removed = []
    for path in sorted(new - shm_used_by()):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed
