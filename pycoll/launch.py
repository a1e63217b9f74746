"""Launching ranks with the mpiexec that the ``mpich`` wheel installs next to Python, and ending
them cleanly however the job ends (its ranks, a killed rank, an abort, a timeout, Ctrl-C, SIGTERM
or SIGHUP, once or many times): the ranks are interrupted, given a moment, then killed, and the
files MPICH and its launcher left (shared memory in ``/dev/shm``, the proxy's topology file in
/tmp) are removed, the job's own only (:mod:`pycoll.leftovers` tells them from other jobs'). Signals
are noted, never raised, until the end is done (pycoll's own segments are memfds, which never
appear there)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from pycoll import auth, config
from pycoll.errors import PycollError
from pycoll.leftovers import JobFiles


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
           servers: int = 0, bind: str = "none", keep_handlers: bool = False) -> int:
    """Run ``cmd`` on ``n`` ranks (and ``servers`` push-pull summation servers after them, running
    ``python -m pycoll.ps.server``, with ``PYCOLL_NUM_SERVERS`` set for all); return the exit
    status. With ``timeout`` (seconds) every rank is killed when it passes, and the status is 124.
    ``bind="core"`` pins each process to a core of its own (mpiexec's ``-bind-to core``); "auto"
    does where :func:`pinnable_cores` has room for them all, else leaves them free.

    Ctrl-C (SIGINT), SIGTERM and SIGHUP to this process end the ranks too (status 130, 143, 129)
    when ``launch`` runs in the main thread (Python takes signals there only); more of them while
    the job ends only cut the ranks' grace short. However the job ended, what it left behind is
    removed before ``launch`` returns. The caller's handlers are set again afterwards (not called),
    unless ``keep_handlers``: a caller that exits next (``pycoll run``) ignores the signals from
    then on, so one that comes after the end cannot turn the status into death by signal. Every
    job gets a fresh random key in its ranks' ``PYCOLL_JOB_KEY`` (see :mod:`pycoll.auth`)."""
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
    env[auth.KEY_VAR] = auth.new_key()  # the job's secret, its ranks' alone (pycoll.auth)
    if servers:
        argv += [":", "-n", str(servers), sys.executable, "-m", "pycoll.ps.server"]
        env["PYCOLL_NUM_SERVERS"] = str(servers)
    job = f"{os.getpid()}.{time.monotonic_ns()}"
    env[JOB_VAR] = job  # every rank carries it, whichever session mpiexec starts it in
    files = JobFiles(JOB_VAR, job)  # (first: the files there now are not the job's)
    # the ranks run in sessions of their own: a signal that ends this process must end them too
    signals = Signals()
    signals.install()
    proc: Optional[subprocess.Popen] = None
    try:
        if signals.received:  # (before the job began)
            return signals.status()
        started = time.time()
        proc = subprocess.Popen(argv, env=dict(os.environ, **env), start_new_session=True)
        files.launcher(proc.pid, started)
        return _wait(proc, files, signals, timeout)
    finally:
        # however it ended (the ranks, the timeout, a signal, an exception here), the job's
        # processes are ended and its files removed, signals noted meanwhile, then handlers put back
        try:
            if proc is not None and (proc.poll() is None or job_processes(job)):
                end_job(proc, job, files, signals)
            files.remove()
        finally:
            signals.restore(ignore=keep_handlers)


def _wait(proc: subprocess.Popen, files: JobFiles, signals: Signals, timeout: Optional[float]) -> int:
    """Wait until mpiexec ends, ``timeout`` passes or a signal comes, looking at the job's files
    meanwhile; the status."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if signals.received:
            sig = signals.received[0]
            if sig != signal.SIGINT:  # (Ctrl-C: the ranks say so themselves)
                print(f"pycoll: {SAID[sig]}; ending the ranks", file=sys.stderr)
            return signals.status()
        if deadline is not None and time.monotonic() >= deadline:
            print(f"pycoll: ranks did not finish within {timeout:g} s; ending them", file=sys.stderr)
            return 124
        files.poll()


class Signals:
    """SIGINT, SIGTERM and SIGHUP to the launcher, noted and never raised while a launch runs and
    while it ends its job: an exception from a handler could cut the ending short, and a handler
    put back before the end would let a second signal kill the launcher with the job half ended.
    Only in the main thread (where Python takes signals), and only signals not ignored (a launch
    in the background stays deaf to Ctrl-C) nor handled from C (Python could not set that back)."""

    STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}

    def __init__(self) -> None:
        self.received: List[int] = []
        self._old: Dict[int, Any] = {}

    def install(self) -> None:
        """Note the signals from now on."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.STATUS:
            old = signal.getsignal(sig)
            if old is not None and old != signal.SIG_IGN:
                self._old[sig] = signal.signal(sig, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.received.append(signum)

    def status(self) -> int:
        """The exit status the first signal asks for (128 + its number)."""
        return self.STATUS[self.received[0]]

    def restore(self, ignore: bool = False) -> None:
        """Set the handlers there were before :meth:`install` again; or, with ``ignore``, ignore
        the signals from now on (Python's own handlers would not do: it sets the default action
        again as it exits, when a signal would still kill the process)."""
        for sig, old in self._old.items():
            signal.signal(sig, signal.SIG_IGN if ignore else old)
        self._old.clear()


#: What the launcher says when a signal ends its job.
SAID = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}
#: How long ranks may take to end themselves after SIGINT (their ``finally`` blocks and atexit
#: handlers run) before SIGKILL, and how often the launcher looks whether mpiexec has ended.
GRACE_S = 2.0
POLL_S = 0.05
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


def end_job(proc: subprocess.Popen, job: str, files: Optional[JobFiles] = None,
            signals: Optional[Signals] = None, grace: float = GRACE_S) -> None:
    """End mpiexec (``proc``) and every process of ``job``: SIGINT (Python ranks unwind, tell
    their peers they left, and may finalize), then, after ``grace`` seconds or once they are gone,
    SIGKILL, until none is left (a few seconds at most). A further signal among ``signals`` (a
    second Ctrl-C or SIGTERM) cuts the grace short. ``files`` looks at what the job's processes
    use (the proxies' topology files) before they are signalled."""
    if files is not None:
        files.sample()
    pids = job_processes(job)
    if proc.poll() is None:  # (a reaped launcher's pid may be another process's by now)
        pids.append(proc.pid)
    had = len(signals.received) if signals is not None else 0
    _signal(pids, signal.SIGINT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or job_processes(job)):
        if signals is not None and len(signals.received) > had:
            break
        time.sleep(0.05)
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
