"""Two "hosts" on one machine: network namespaces joined by a veth pair (iproute2), ranks started
in each with ``ip netns exec`` and bootstrapped through a TCP store on the first host's address.

Traffic between the namespaces crosses the veth pair (a real network path through the kernel's
TCP stack); ranks in one namespace still share /dev/shm and may use shared memory, as ranks on one
host do. Needs root (CAP_SYS_ADMIN) and ``ip``; tests skip, saying why, where that is missing.
Namespaces are removed whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from tests.mpirun import ROOT

_available: Optional[str] = None  # "" when namespaces work, else why not


def need_ucx() -> None:
    """Skip the test, saying why, when UCX cannot be loaded."""
    try:
        from pycoll.tl.ucx import loader

        loader.load()
    except Exception as exc:  # noqa: BLE001 - any reason is a reason to skip
        pytest.skip(f"UCX is not available: {exc}")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def netns_unavailable() -> str:
    """Why network namespaces cannot be used here ("" if they can)."""
    global _available
    if _available is None:
        if shutil.which("ip") is None:
            _available = "iproute2 ('ip') is not installed"
        else:
            name = f"pycoll-probe{os.getpid()}"
            try:
                _ip("netns", "add", name)
                _ip("netns", "del", name)
                _available = ""
            except (subprocess.CalledProcessError, OSError) as exc:
                err = getattr(exc, "stderr", "") or str(exc)
                _available = f"cannot create network namespaces: {err.strip()}"
    return _available


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
    with two_hosts() as hosts:
        master = hosts[0][1]
        procs = []
        rank = 0
        try:
            for (ns, _), count in zip(hosts, per_host):
                for _ in range(count):
                    full_env = dict(os.environ, PYTHONPATH=str(ROOT), RANK=str(rank), WORLD_SIZE=str(size),
                                    MASTER_ADDR=master, MASTER_PORT="29517", PYCOLL_NODE_ID=ns,
                                    PYCOLL_TIMEOUT=str(max(10, timeout - 20)), **(env or {}))
                    cmd = ["ip", "netns", "exec", ns, sys.executable, "-u", str(ROOT / script), *args]
                    procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                  text=True, env=full_env, start_new_session=True,
                                                  cwd=str(ROOT)))
                    rank += 1
            outs = []
            for p in procs:
                try:
                    out, _ = p.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    out = "(timed out)"
                outs.append(out)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.communicate()
    text = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{o[-3000:]}"
                     for r, (p, o) in enumerate(zip(procs, outs)))
    ok = {int(m) for o in outs for m in re.findall(r"RANK (\d+) OK", o)}
    failed = sorted(set(range(size)) - ok)
    if failed or any(p.returncode for p in procs):
        pytest.fail(f"{script} on hosts {per_host}: failed ranks {failed}\n{text[-8000:]}")
    return text
