"""The files an MPI job leaves behind when it does not end itself cleanly, told apart from every
other job's, and removed.

MPICH and its launcher (Hydra) keep state in files that nobody removes once a rank is killed, the
job aborts or the launcher's proxy is killed:

- ``/dev/shm/mpich_shm_<world>_<node>`` (and ``mpich_vci_...``): a node's ranks' shared memory,
  opened by name in ``MPI_Init`` and removed by the last rank to finalize. ``<world>`` is the
  32-bit FNV-1a hash (``%x``) of the job's PMI kvs name, which Hydra's mpiexec makes as
  ``kvs_<its pid>_<pgid>_<rand()>_<hostname>`` with ``rand()`` seeded by ``time(NULL)`` as it
  starts: so a job's names follow from its mpiexec's pid and the second it started, whether or not
  any of its processes was ever looked at (:func:`hydra_world_ids`);
- ``/dev/shm/mpich_shm_<pid>_0``: the same, of a process that started MPI without a launcher
  (a singleton: ``<pid>`` is its own, ``%x``), removed when it finalizes;
- ``/dev/shm/mpich_shar_tmpXXXXXX`` (``/tmp/...`` where /dev/shm is full): segments of shared
  windows, made with ``mkstemp`` and mapped by the ranks until they are removed;
- ``/tmp/hydra_hwloc_xmlfile_XXXXXX`` (always /tmp, whatever TMPDIR says): the machine's topology,
  written by each proxy as it starts, held open, and removed when the proxy ends itself.

pycoll's own segments are memfds and never appear in /dev/shm; a ``/dev/shm/pycoll*`` entry is a
bug, counted (and removed) like MPICH's.

A job's own files (:class:`JobFiles`) are those its processes map or hold open, sampled from /proc
while it runs, and the named segments of its Hydra mpiexec and of its singletons (made while that
pid was the job's). Its processes are those whose
environment holds a mark (``VAR=value``): mpiexec starts each proxy and rank in a session of its
own, so no process group holds them, but every one inherits the environment. Files that existed
before the job began, or that a live process still uses, are never removed; another job's files
(another mpiexec's names, files only other processes map) are never counted.
"""

from __future__ import annotations

import fnmatch
import os
import re
import socket
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

#: The files of MPI's machinery (and pycoll's, which must never be there) a job may leave.
PATTERNS = ("/dev/shm/mpich_*", "/dev/shm/pycoll*", "/tmp/mpich_shar_tmp*", "/tmp/hydra_hwloc_xmlfile_*")
#: What Hydra's mpiexec is called (``/proc/<pid>/comm``), and its proxy, which it starts once it
#: has made its kvs name (so the proxy's start bounds the second that name was seeded in).
HYDRA_LAUNCHERS = frozenset({"mpiexec", "mpiexec.hydra", "mpirun"})
HYDRA_PROXY = "hydra_pmi_proxy"
#: Process groups (``MPI_Comm_spawn`` makes more) whose kvs names are predicted per mpiexec.
SPAWNED_GROUPS = 4
#: How often :meth:`JobFiles.poll` looks: quickly at first (most files appear in MPI_Init), then
#: every second at most, and never for more than ``LOOK_SHARE`` of a core (reading the maps of many
#: ranks costs time the ranks would use: about a millisecond a rank).
FIRST_LOOK_S, LAST_LOOK_S, LOOK_SHARE = 0.01, 1.0, 0.03


_OURS = re.compile("|".join(fnmatch.translate(p) for p in PATTERNS))
#: the paths in /dev/shm or /tmp in a process's maps (one a line, after its other columns)
_MAPPED = re.compile(rb"[ \t](/(?:dev/shm|tmp)/[^\n]*)$", re.MULTILINE)


def _ours(path: str) -> bool:
    """Whether ``path`` is MPI's machinery's (``PATTERNS``)."""
    return _OURS.match(path) is not None


def existing() -> Set[str]:
    """The files matching ``PATTERNS`` that exist now and belong to this user."""
    uid = os.getuid()
    found = set()
    for folder in sorted({os.path.dirname(p) for p in PATTERNS}):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if _ours(path):
                try:
                    if os.lstat(path).st_uid == uid:
                        found.add(path)
                except OSError:
                    pass
    return found


def files_of(pid: int) -> Set[str]:
    """The files matching ``PATTERNS`` that process ``pid`` maps or holds open (not those already
    removed: ``(deleted)``)."""
    found: Set[str] = set()
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            data = f.read()
    except OSError:
        data = b""
    for m in _MAPPED.finditer(data):
        path = m.group(1).decode(errors="replace")
        if not path.endswith(" (deleted)") and _ours(path):
            found.add(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if _ours(target):
            found.add(target)
    return found


def used(paths: Set[str]) -> Set[str]:
    """Those of ``paths`` that some live process (of any job) maps or holds open."""
    found: Set[str] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != str(os.getpid()):
            found |= files_of(int(entry)) & paths
            if found == paths:
                break
    return found


# ------------------------------------------------------------------ MPICH's names for a Hydra job
def glibc_rand(seed: int, count: int) -> List[int]:
    """The first ``count`` values of glibc's ``rand()`` after ``srand(seed)`` (its additive
    generator, TYPE_3), as Hydra's mpiexec draws them; computed here because calling libc's own
    would reseed this process's."""
    word = seed & 0xFFFFFFFF
    if word >= 1 << 31:
        word -= 1 << 32  # (glibc keeps the seed as int32_t)
    word = word or 1
    r = [word]
    for _ in range(30):
        q = abs(word) // 127773
        hi = q if word >= 0 else -q  # (C's division truncates toward zero)
        word = 16807 * (word - hi * 127773) - 2836 * hi
        if word < 0:
            word += 2147483647
        r.append(word)
    r = [x & 0xFFFFFFFF for x in r]
    r += r[:3]
    for i in range(34, 344 + count):
        r.append((r[i - 31] + r[i - 3]) & 0xFFFFFFFF)
    return [x >> 1 for x in r[344:]]


def mpich_world_id(kvsname: str) -> int:
    """MPICH's world id of a job: the FNV-1a hash of its PMI kvs name (``MPIR_pmi_init``)."""
    h = 2166136261
    for b in kvsname.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def hydra_world_ids(pid: int, first: int, last: int, host: Optional[str] = None,
                    groups: int = SPAWNED_GROUPS) -> Set[str]:
    """The world ids (as MPICH writes them in file names, ``%x``) of the jobs of the Hydra mpiexec
    ``pid`` that seeded ``rand()`` in a second from ``first`` to ``last`` (epoch seconds): its
    process groups 0 .. ``groups``-1 (the first, then those ``MPI_Comm_spawn`` made), each named
    with the next ``rand()``."""
    host = socket.gethostname() if host is None else host
    ids = set()
    for second in range(first, last + 1):
        for pgid, rnd in enumerate(glibc_rand(second, groups)):
            ids.add(f"{mpich_world_id(f'kvs_{pid}_{pgid}_{rnd}_{host}'):x}")
    return ids


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


_BOOT = _boot_time()
_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> Optional[Tuple[str, int, float]]:
    """(name, parent pid, start time in epoch seconds) of process ``pid``, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    name = text[text.find("(") + 1:text.rfind(")")]
    fields = text[text.rfind(")") + 2:].split()
    try:
        return name, int(fields[1]), _BOOT + int(fields[19]) / _TICK
    except (IndexError, ValueError):
        return None


# ------------------------------------------------------------------ one job's files
class JobFiles:
    """The files (``PATTERNS``) one job made: those its processes, marked by ``var=value`` in their
    environment, map or hold open when :meth:`sample` looks (or :meth:`watch`'s thread), and the
    named segments MPICH gives the jobs of its Hydra mpiexec (found among its processes, or told
    by :meth:`launcher`), which need no look at all. Made before the job starts: files that exist
    then are not the job's."""

    def __init__(self, var: str, value: str) -> None:
        self._mark = f"{var}={value}\0".encode()
        self._before = existing()
        self._seen: Set[str] = set()
        self._members: Set[int] = set()  # this job's processes, as last looked at
        self._others: Dict[int, float] = {}  # processes that are not (yet) this job's -> start time
        # Hydra mpiexec -> [its start, then by when it had seeded rand(): its first proxy's start,
        # or when it was found gone]
        self._launchers: Dict[int, List[float]] = {}
        self._ids: Dict[Tuple[int, int], Set[str]] = {}  # (mpiexec, second) -> world ids
        self._lives: Dict[int, List[float]] = {}  # every process of the job -> [start, found gone]
        self._lock = threading.RLock()
        self._took = 0.0  # seconds the last look at the members' files took
        self._pause, self._due = FIRST_LOOK_S, 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def launcher(self, pid: int, started: float) -> None:
        """Tell of the job's Hydra mpiexec ``pid``, started at or after ``started`` (epoch s)."""
        with self._lock:
            self._members.add(pid)
            self._launchers.setdefault(pid, [started, 0.0])

    def sample(self) -> None:
        """Look once at the job's processes and note the files they map or hold open."""
        with self._lock:
            pids = {int(e) for e in os.listdir("/proc") if e.isdigit()}
            self._members &= pids
            now = time.time()
            for pid, seeded in self._launchers.items():
                if not seeded[1] and pid not in pids:
                    seeded[1] = now  # (its pid may be another mpiexec's from now on)
            for pid, life in self._lives.items():
                if not life[1] and pid not in pids:
                    life[1] = now  # (its pid may be another process's from now on)
            self._others = {p: t for p, t in self._others.items() if p in pids}
            # a process just forked may not have exec'd with the job's environment yet: a young
            # one that is not the job's is looked at again
            fresh = pids - self._members - set(self._others) - {os.getpid()}
            young = {p for p, t in self._others.items() if now - t < 2.0}
            for pid in fresh | young:
                self._classify(pid)
            start = time.monotonic()
            for pid in self._members:
                self._seen |= files_of(pid)
            self._took = time.monotonic() - start

    def poll(self) -> None:
        """:meth:`sample` if a look is due (see ``FIRST_LOOK_S``): for a caller that waits on the
        job in a loop of its own."""
        if time.monotonic() >= self._due:
            self.sample()
            self._due = time.monotonic() + max(self._pause, self._took / LOOK_SHARE)
            self._pause = min(LAST_LOOK_S, self._pause * 2)

    def _classify(self, pid: int) -> None:
        stat = _stat(pid)
        if stat is None:
            self._others.pop(pid, None)
            return
        name, parent, started = stat
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                marked = self._mark in f.read()
        except OSError:
            marked = False
        if not marked:
            self._others[pid] = started
            return
        self._others.pop(pid, None)
        self._members.add(pid)
        self._lives[pid] = [started, 0.0]
        if name in HYDRA_LAUNCHERS:
            self._launchers.setdefault(pid, [started, 0.0])
        elif name == HYDRA_PROXY and parent in self._launchers:
            seen = self._launchers[parent]
            seen[1] = min(seen[1], started) if seen[1] else started

    def watch(self) -> JobFiles:
        """Sample in a thread of its own until :meth:`stop` (for a caller that waits on the job)."""
        def run() -> None:
            while not self._stop.wait(max(0.0, self._due - time.monotonic())):
                self.poll()

        self.poll()
        self._thread = threading.Thread(target=run, name="pycoll-jobfiles", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End :meth:`watch`'s thread (after a last look)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()

    def named(self) -> Set[str]:
        """MPICH's named segments of the job's Hydra launchers, and of its singletons (made while
        their pid was the job's), that exist now."""
        ids: Set[str] = set()
        now = time.time()
        with self._lock:
            for pid, (started, seeded) in self._launchers.items():
                for second in range(int(started) - 2, int(seeded or now) + 2):
                    if (pid, second) not in self._ids:
                        self._ids[pid, second] = hydra_world_ids(pid, second, second)
                    ids |= self._ids[pid, second]
            lives = {f"{pid:x}": tuple(life) for pid, life in self._lives.items()}
        found = set()
        try:
            names = os.listdir("/dev/shm")
        except OSError:
            return found
        for name in names:
            parts = name.split("_")
            if len(parts) != 4 or parts[0] != "mpich" or parts[1] not in ("shm", "vci"):
                continue
            path = f"/dev/shm/{name}"
            if parts[2] in ids:
                found.add(path)
            elif parts[2] in lives:
                started, gone = lives[parts[2]]
                try:
                    changed = os.stat(path).st_ctime
                except OSError:
                    continue
                if started - 2 <= changed and (not gone or changed <= gone):  # (start: to a second)
                    found.add(path)
        return found

    def seen(self) -> Set[str]:
        """Every file of the job's processes noted so far (some may be gone by now)."""
        with self._lock:
            return set(self._seen)

    def present(self) -> List[str]:
        """The job's files that exist now (after a look at its processes): while it runs, those it
        uses; once it has ended, what it left behind."""
        self.sample()
        with self._lock:
            names = self._seen | self.named()
        return sorted((names & existing()) - self._before)

    def remove(self) -> List[str]:
        """Remove what the job left (:meth:`present`) but any file a live process still uses;
        returns the paths removed."""
        left = set(self.present())
        removed = []
        for path in sorted(left - used(left) if left else ()):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
        return removed
