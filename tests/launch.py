"""Starting the processes of multi-process tests: ranks under mpiexec, torch ranks (env://, torchrun,
mpiexec), ranks in two network-namespace "hosts", ranks bootstrapped through a TCP store, and plain
commands (the ``pycoll`` command line).

Every launch has a wall-clock limit and runs in its own session; its processes carry a tag in their
environment (``LAUNCH_VAR``), and when the launch times out or ends every process with the tag is
killed (mpiexec starts each proxy and rank in a session of its own), so none outlives the test.
What a launch's own processes left behind (``pycoll.leftovers``: the files they mapped or held
open, and MPICH's named segments of their mpiexec; never another job's) is removed: /dev/shm
``pycoll*`` entries fail the test (pycoll's segments are memfds and must never show up there);
MPICH's segments and its launcher's topology files (a killed or aborted job under a bare mpiexec
leaves them) do not, unless the test asks for ``Launch.leftovers()``.
Launched scripts report through ``tests/rank.py``: each rank prints ``RANK <r> OK`` when it passes,
or ``RANK <r> FAILED`` and its traceback; a launch that misses an OK fails the test naming the ranks
that failed (quoting their tracebacks), the ranks that did not finish, and the output's tail.

conftest.py hands these out as fixtures (``mpirun``, ``torchrun``, ``hosts``, ``store_ranks``,
``cli``, ``run_cmd``); a test that takes one is marked ``procs``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from pycoll.leftovers import JobFiles

ROOT = Path(__file__).resolve().parent.parent
#: what torch launchers set; removed from a child's environment unless given explicitly.
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: set (to a tag of its own) in the environment of every process a launch starts, to find them all.
LAUNCH_VAR = "TESTS_PYCOLL_LAUNCH"
_launches = itertools.count()


# ------------------------------------------------------------------ processes and their leftovers
def child_env(extra: Optional[Dict[str, str]] = None, drop: Sequence[str] = ()) -> Dict[str, str]:
    """This environment with PYTHONPATH at the checkout (``tests.*`` importable), ``drop`` removed,
    then ``extra`` added."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for var in drop:
        env.pop(var, None)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def shm_entries(word: str = "pycoll") -> List[str]:
    """The /dev/shm entries whose name contains ``word``, sorted."""
    try:
        return sorted(e for e in os.listdir("/dev/shm") if word in e.lower())
    except FileNotFoundError:
        return []


def tagged(tag: str) -> List[int]:
    """The processes whose environment holds ``LAUNCH_VAR=tag`` (a launch's, at any depth)."""
    mark = f"{LAUNCH_VAR}={tag}\0".encode()
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def kill_tagged(tag: str, wait: float = 5.0) -> None:
    """SIGKILL every process of the launch ``tag`` (mpiexec runs each proxy and rank in a session
    of its own, so killing mpiexec's group is not enough) and wait until they are gone."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        pids = [p for p in tagged(tag) if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


class Launch(dict):
    """``{LAUNCH_VAR: tag}``, for the environment of a launch's processes, with ``files``: the
    files of MPI's machinery (and pycoll's) that its processes made, watched while it runs
    (pycoll.leftovers.JobFiles): another job's are not among them."""

    def __init__(self, tag: str) -> None:
        super().__init__({LAUNCH_VAR: tag})
        self.tag = tag
        self.files = JobFiles(LAUNCH_VAR, tag)

    def leftovers(self) -> List[str]:
        """The launch's files that exist now: once its processes have ended, what they left."""
        return self.files.present()


@contextlib.contextmanager
def launched(what: str) -> Iterator[Launch]:
    """Around a launch: yields a :class:`Launch` (``{LAUNCH_VAR: tag}`` for the children's
    environment) whose files are watched while it runs. Afterwards every process carrying the tag
    is killed and what they left is removed; /dev/shm pycoll entries among it fail the test."""
    job = Launch(f"{os.getpid()}.{next(_launches)}")
    job.files.watch()
    try:
        yield job
    finally:  # even when the launch failed; leftovers are reported only when it did not
        kill_tagged(job.tag)
        job.files.stop()
        left = [p for p in job.files.present() if os.path.basename(p).startswith("pycoll")]
        job.files.remove()
    if left:
        pytest.fail(f"{what} left /dev/shm entries behind (now removed): {left}")


def read_until(proc: subprocess.Popen, word: str, ranks: int, timeout: float, what: str) -> str:
    """Read ``proc``'s output (a pipe) until ``"<word> <rank>"`` came from each of ``ranks``
    ranks (each printing it in one piece, ``print(f"UP {rank}")``: mpiexec may mix the ranks'
    writes); fail the test naming the ranks that did not say it within ``timeout`` seconds (or
    before the output ended). Returns what was read (``communicate`` reads the rest)."""
    fd = proc.stdout.fileno()
    out = b""
    deadline = time.monotonic() + timeout
    missing = set(range(ranks))
    while missing:
        left = deadline - time.monotonic()
        ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
        chunk = os.read(fd, 65536) if ready else b""
        out += chunk
        missing = {r for r in range(ranks) if f"{word} {r}".encode() not in out}
        if missing and not chunk:
            why = f"within {timeout} s" if left <= 0 or not ready else "before its output ended"
            pytest.fail(f"{what}: ranks {sorted(missing)} did not say {word!r} {why}\n"
                        f"{out.decode(errors='replace')[-3000:]}")
    return out.decode(errors="replace")


def communicate(proc: subprocess.Popen, timeout: float) -> Tuple[str, bool]:
    """The merged output of ``proc`` (started in its own session) and whether it timed out; its
    whole process group is killed either way, so nothing it started outlives the call."""
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        out, _ = proc.communicate()
    finally:
        kill_group(proc)
    return out, timed_out


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group (session) ``proc`` leads, whatever is still in it, reap it, and
    wait (up to 5 s) until every member is gone (their mappings of /dev/shm with them)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.01)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpiexec() -> str:
    """The mpiexec beside this Python (the mpich wheel's), else the one on PATH; skip if none."""
    exe = Path(sys.executable).parent / "mpiexec"
    if exe.exists():
        return str(exe)
    found = shutil.which("mpiexec")
    if not found:
        pytest.skip("mpiexec not found (pip install mpich)")
    return found


# ------------------------------------------------------------------ which ranks failed
def ok_ranks(out: str) -> set:
    """The ranks that printed ``RANK r OK`` (anywhere: mpiexec may interleave ranks mid-line)."""
    return {int(m) for m in re.findall(r"RANK (\d+) OK", out)}


def failed_ranks(out: str) -> set:
    """The ranks that printed ``RANK r FAILED`` (and their traceback after it)."""
    return {int(m) for m in re.findall(r"RANK (\d+) FAILED", out)}


def failure_report(what: str, n: int, out: str, codes: Sequence[Optional[int]],
                   timeout: Optional[float] = None) -> str:
    """Why ``what`` on ``n`` ranks failed: the ranks that failed (printed ``RANK r FAILED``) with
    their tracebacks, the ranks that did not finish, the exit codes and the output's tail."""
    failed = sorted(failed_ranks(out))
    missing = sorted(set(range(n)) - ok_ranks(out) - set(failed))
    head = f"{what} on {n} ranks: " + (f"did not finish within {timeout} s" if timeout is not None
                                       else f"exit {list(codes)}")
    head += f"; failed ranks {failed}" if failed else ""
    head += f"; ranks that did not finish: {missing}" if missing else ""
    tracebacks = []
    for m in re.finditer(r"RANK (\d+) FAILED\n", out):
        tracebacks.append(f"--- rank {m.group(1)} failed:\n{out[m.end():m.end() + 2500]}")
    return "\n".join([head, *tracebacks[:4], "--- output tail:", out[-6000:]])


def check_ranks(what: str, n: int, out: str, codes: Sequence[Optional[int]], timed_out: bool,
                timeout: float) -> None:
    """Fail the test, naming the ranks, unless every rank printed ``RANK r OK`` (none FAILED) and
    every process exited 0."""
    if timed_out:
        pytest.fail(failure_report(what, n, out, codes, timeout))
    if any(codes) or failed_ranks(out) or ok_ranks(out) != set(range(n)):
        pytest.fail(failure_report(what, n, out, codes))


# ------------------------------------------------------------------ launchers
def run_command(cmd: Sequence[str], *, timeout: float, env: Optional[Dict[str, str]] = None,
                cwd: Optional[str] = None, merge: bool = False,
                what: Optional[str] = None) -> Tuple[int, str, str]:
    """Run ``cmd`` in its own process group with a wall-clock limit: (exit code, stdout, stderr)
    (``merge``: stderr into stdout). On timeout the group is killed and the test fails."""
    what = what or " ".join(map(str, cmd[:6]))
    with launched(what) as tag:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True,
                                env={**(child_env() if env is None else env), **tag}, cwd=str(cwd or ROOT),
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            pytest.fail(f"{what} did not finish within {timeout} s\n{out[-3000:]}{(err or '')[-3000:]}")
        finally:
            kill_group(proc)
    return proc.returncode, out, err or ""


def pycoll_cli(*args: str, timeout: float = 240, cwd: Optional[str] = None,
               env: Optional[Dict[str, str]] = None) -> Tuple[int, str, str]:
    """Run ``python -m pycoll.cli ARGS`` (in the checkout unless ``cwd``): (exit code, stdout, stderr)."""
    return run_command([sys.executable, "-m", "pycoll.cli", *args], timeout=timeout, cwd=cwd, env=env,
                       what=f"pycoll {' '.join(args[:3])}")


def run_ranks(n: int, script: str, *args: str, timeout: float = 120, env: Optional[dict] = None,
              groups: Optional[list] = None) -> str:
    """Run ``python script args`` on ``n`` ranks under mpiexec; fail the test naming the rank(s)
    that failed. Returns the combined output.

    ``script`` is relative to the checkout. ``groups``: ``[(count, {VAR: value}), ...]`` gives
    successive blocks of ranks their own environment (mpiexec's MPMD form), e.g. a PYCOLL_NODE_ID
    per block. PYCOLL_TIMEOUT defaults to 10 s under ``timeout``.
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
    full_env = child_env(env)
    full_env.setdefault("PYCOLL_TIMEOUT", str(max(10, timeout - 10)))
    with launched(f"{script} on {n} ranks") as tag:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**full_env, **tag}, start_new_session=True, cwd=str(ROOT))
        out, timed_out = communicate(proc, timeout)
    check_ranks(script, n, out, [proc.returncode], timed_out, timeout)
    return out


def run_torch(n: int, script: str, *args: str, launcher: str = "env", timeout: float = 120,
              env: Optional[dict] = None) -> str:
    """Run ``python script args`` as ``n`` torch ranks; fail the test naming the ranks that did not
    print ``RANK r OK``. Returns the combined output. ``launcher``:

    * ``env``: what torchrun hands its workers (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
      LOCAL_RANK) set directly on ``n`` processes: ``init_process_group`` rendezvous through env://;
    * ``torchrun``: the real launcher (``python -m torch.distributed.run``);
    * ``mpiexec``: the bundled mpiexec; ``import pycoll.torch`` fills in the env:// variables.
    """
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    base = child_env({"OMP_NUM_THREADS": "1", **(env or {})}, drop=TORCH_VARS)
    base.setdefault("PYCOLL_TIMEOUT", str(max(10, timeout - 10)))
    path = str(ROOT / script)
    what = f"{script} ({launcher})"
    timed_out = False
    with launched(f"{what} on {n} ranks") as tag:
        base.update(tag)
        if launcher == "env":
            port = free_port()
            procs, files = [], []
            try:
                for r in range(n):
                    f = tempfile.TemporaryFile("w+")
                    files.append(f)
                    rank_env = dict(base, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                                    LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                    procs.append(subprocess.Popen([sys.executable, "-u", path, *args], stdout=f,
                                                  stderr=subprocess.STDOUT, env=rank_env,
                                                  start_new_session=True, cwd=str(ROOT)))
                deadline = time.monotonic() + timeout
                for p in procs:
                    try:
                        p.wait(timeout=max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        timed_out = True
                        break
            finally:
                for p in procs:
                    kill_group(p)
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
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=base, start_new_session=True, cwd=str(ROOT))
            out, timed_out = communicate(proc, timeout)
            codes = [proc.returncode]
    check_ranks(what, n, out, codes, timed_out, timeout)
    return out


def run_store_ranks(script: str, size: int, *args: str, timeout: float = 60, env: Optional[dict] = None,
                    store_timeout: float = 30) -> Tuple[List[int], List[str]]:
    """Run ``python -c script RANK SIZE PORT args`` as ``size`` processes, each in its own process
    group, around a TCPStore served here on PORT: (exit codes, outputs). The caller checks them;
    a rank still running after ``timeout`` fails the test, naming it."""
    from pycoll.store import TCPStore

    server = TCPStore(port=0, is_master=True, timeout=store_timeout)
    full_env = child_env(env)
    procs: List[subprocess.Popen] = []
    outs: List[str] = []
    late: List[int] = []
    with launched(f"{size} store ranks") as tag:
        full_env.update(tag)
        try:
            for r in range(size):
                cmd = [sys.executable, "-c", script, str(r), str(size), str(server.port), *args]
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True, env=full_env, start_new_session=True, cwd=str(ROOT)))
            deadline = time.monotonic() + timeout
            for r, p in enumerate(procs):
                try:
                    outs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
                except subprocess.TimeoutExpired:
                    kill_group(p)
                    outs.append(p.communicate()[0])
                    late.append(r)
        finally:
            for p in procs:
                kill_group(p)
            server.close()
    if late:
        text = "\n".join(f"--- rank {r}:\n{o[-3000:]}" for r, o in enumerate(outs))
        pytest.fail(f"store ranks {late} of {size} did not finish within {timeout} s\n{text}")
    return [p.returncode for p in procs], outs


# ------------------------------------------------------------------ two hosts (network namespaces)
# Two "hosts" on one machine: network namespaces joined by a veth pair (iproute2), ranks started in
# each with ``ip netns exec`` and bootstrapped through a TCP store on the first host's address.
# Traffic between the namespaces crosses the veth pair (a real network path through the kernel's
# TCP stack); ranks in one namespace still share /dev/shm and may use shared memory, as ranks on one
# host do. Needs root (CAP_SYS_ADMIN) and ``ip``; tests skip, saying why, where that is missing.
# Namespaces are removed whatever happens.
_netns: Optional[str] = None  # "" when namespaces work, else why not


def need_ucx(allow_module_level: bool = False) -> None:
    """Skip the test (or module), saying why, when UCX cannot be loaded."""
    try:
        from pycoll.tl.ucx import loader

        loader.load()
    except Exception as exc:  # noqa: BLE001 - any reason is a reason to skip
        pytest.skip(f"UCX is not available: {exc}", allow_module_level=allow_module_level)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS`` (iproute2)."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def netns_unavailable() -> str:
    """Why network namespaces cannot be used here ("" if they can)."""
    global _netns
    if _netns is None:
        if shutil.which("ip") is None:
            _netns = "iproute2 ('ip') is not installed"
        else:
            name = f"pycoll-probe{os.getpid()}"
            try:
                _ip("netns", "add", name)
                _ip("netns", "del", name)
                _netns = ""
            except (subprocess.CalledProcessError, OSError) as exc:
                err = getattr(exc, "stderr", "") or str(exc)
                _netns = f"cannot create network namespaces: {err.strip()}"
    return _netns


@contextlib.contextmanager
def two_hosts() -> Iterator[List[Tuple[str, str]]]:
    """Namespaces A and B joined by a veth pair: yields ``[(netns, address), ...]``."""
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    tag = os.getpid() % 100000
    subnet = 10 + os.getpid() % 240
    hosts = [(f"pycollA{tag}", f"10.77.{subnet}.1"), (f"pycollB{tag}", f"10.77.{subnet}.2")]
    veth = (f"pcva{tag}", f"pcvb{tag}")
    try:
        for ns, _ in hosts:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", veth[0], "netns", hosts[0][0], "type", "veth", "peer", "name", veth[1],
            "netns", hosts[1][0])
        for (ns, addr), dev in zip(hosts, veth):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        # the kernel reports the carrier a moment later (its link watch runs deferred, up to a
        # second or more on a busy machine): ranks started before see no usable device (UCX
        # then offers only loopback to its peers)
        deadline = time.monotonic() + 10
        while not all(" UP " in _ip("-n", ns, "-br", "link", "show", "dev", dev).stdout
                      for (ns, _), dev in zip(hosts, veth)):
            if time.monotonic() > deadline:
                pytest.fail("the veth pair between the namespaces did not come up within 10 s")
            time.sleep(0.05)
        yield hosts
    finally:
        for ns, _ in hosts:
            _ip("netns", "del", ns, check=False)  # takes its end of the veth pair with it


def run_hosts(script: str, per_host: List[int], *args: str, timeout: float = 120,
              env: Optional[Dict[str, str]] = None) -> str:
    """Run ``python script args`` as ``per_host[i]`` ranks on host i (ranks numbered host by host;
    each process gets RANK, WORLD_SIZE, MASTER_ADDR/PORT and PYCOLL_NODE_ID=its host); fail the test
    naming the ranks that did not print ``RANK r OK``."""
    size = sum(per_host)
    with two_hosts() as hosts, launched(f"{script} on hosts {per_host}") as tag:
        master = hosts[0][1]
        procs = []
        rank = 0
        try:
            for (ns, _), count in zip(hosts, per_host):
                for _ in range(count):
                    full_env = child_env({"RANK": str(rank), "WORLD_SIZE": str(size), "MASTER_ADDR": master,
                                          "MASTER_PORT": "29517", "PYCOLL_NODE_ID": ns,
                                          "PYCOLL_TIMEOUT": str(max(10, timeout - 20)), **(env or {}), **tag})
                    cmd = ["ip", "netns", "exec", ns, sys.executable, "-u", str(ROOT / script), *args]
                    procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                  text=True, env=full_env, start_new_session=True,
                                                  cwd=str(ROOT)))
                    rank += 1
            outs = []
            deadline = time.monotonic() + timeout
            for p in procs:
                try:
                    out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    kill_group(p)
                    out = "(timed out)\n" + p.communicate()[0]
                outs.append(out)
        finally:
            for p in procs:
                kill_group(p)
    text = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{o[-3000:]}"
                     for r, (p, o) in enumerate(zip(procs, outs)))
    ok = {int(m) for o in outs for m in re.findall(r"RANK (\d+) OK", o)}
    failed = sorted(set(range(size)) - ok)
    if failed or any(p.returncode for p in procs):
        pytest.fail(f"{script} on hosts {per_host}: failed ranks {failed}\n{text[-8000:]}")
    return text
