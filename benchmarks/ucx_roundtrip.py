"""The 8-byte round trip over UCX: UCX's own (``ucx_perftest -t tag_lat``, shipped in the libucx
wheel) against the same ping-pong as a pycoll program run by the native executor.

    python benchmarks/ucx_roundtrip.py [--iters N]

Three figures, on the same host, in one run:

- ``ucx_perftest``: a server and a client process, UCP tag messages, 8 B (its latency column is
  one way: the round trip is twice it);
- ``executor``: a two-rank program (rank 0 sends, then receives; rank 1 receives, then sends) run
  by the native executor round after round: in a C loop (``pc_exec_repeat``: no Python between
  rounds), and from a Python loop of one native call per round trip (``pc_exec_run``: the
  executor's start, its posts and polls), under ``pycoll run -n 2`` with ``PYCOLL_TLS=ucx``;
- ``run_program``: the same program through ``team.run_program(...).wait()`` (the engine's task,
  its request).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def perftest(iters: int) -> float:
    """UCX's own round trip at 8 B (us), or nan where the wheel has no ucx_perftest."""
    import libucx  # noqa: PLC0415 - the wheel pycoll's UCX comes from

    root = Path(libucx.__file__).parent
    exe = root / "bin" / "ucx_perftest"
    if not exe.exists():
        return float("nan")
    env = dict(os.environ, LD_LIBRARY_PATH=f"{root / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    args = ["-t", "tag_lat", "-s", "8", "-n", str(iters), "-p", "13391"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    server = subprocess.Popen([str(exe), *args], env=env, **quiet)
    try:
        time.sleep(0.5)
        out = subprocess.run([str(exe), "127.0.0.1", *args], env=env, capture_output=True, text=True,
                             timeout=60).stdout
    finally:
        server.wait(timeout=30)
    final = re.search(r"Final:\s+\d+\s+([\d.]+)\s+([\d.]+)", out)
    return 2 * float(final.group(2)) if final else float("nan")


def rank_main(iters: int) -> None:
    """Under ``pycoll run -n 2``: the program's round trip through the executor and the engine."""
    import numpy as np  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    from pycoll import Team  # noqa: PLC0415
    from pycoll.lower import Instr, Program, check_set  # noqa: PLC0415

    team = Team.from_mpi(MPI.COMM_WORLD)
    r = team.rank
    assert team.size == 2 and team.transport.name == "ucx", team.transport

    def program(rank: int) -> Program:
        peer = 1 - rank
        if rank == 0:
            instrs = [Instr("send", {"buf": ("src", 0, 8)}, [], peer=peer, step=0),
                      Instr("recv", {"buf": ("dst", 0, 8)}, [], peer=peer, step=1)]
        else:
            instrs = [Instr("recv", {"buf": ("dst", 0, 8)}, [], peer=peer, step=0),
                      Instr("send", {"buf": ("dst", 0, 8)}, [0], peer=peer, step=1)]
        return Program("allreduce", "pingpong", rank, 2, 2, "float32", "sum", 0, False,
                       {"src": 8, "dst": 8}, instrs)

    programs = [program(0), program(1)]
    check_set(programs)
    x, y = np.ones(2, np.float32), np.zeros(2, np.float32)
    for _ in range(100):
        team.run_program(programs[r], x, y).wait()
    MPI.COMM_WORLD.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        req = team.run_program(programs[r], x, y)
        req.wait()
    engine = (time.perf_counter() - t0) / iters * 1e6
    task = req.task
    lib, e, transport = task.prepared.lib, task.e, task.prepared.transport
    base = transport.untagged_base(("c", 1 << 19))  # (a number no collective of this run takes; one
    run, done = lib.pc_exec_run, lib.PC_EXEC_DONE  # tag for every round: each ends before the next)
    MPI.COMM_WORLD.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        if run(e, base, 10**9, 0) != done:
            raise RuntimeError("the ping-pong program failed")
    native = (time.perf_counter() - t0) / iters * 1e6
    MPI.COMM_WORLD.Barrier()
    t0 = time.perf_counter()
    if lib.pc_exec_repeat(e, base, iters) != done:
        raise RuntimeError("the ping-pong program failed")
    alone = (time.perf_counter() - t0) / iters * 1e6
    MPI.COMM_WORLD.Barrier()
    if r == 0:
        print(f"executor (C loop)      {alone:8.2f} us\nexecutor (Python loop) {native:8.2f} us\n"
              f"run_program            {engine:8.2f} us", flush=True)
    team.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=100000)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank:
        rank_main(a.iters)
        return 0
    print(f"# 8 B round trip, us (machine: {os.uname().nodename}, {os.cpu_count()} cpus)")
    print(f"ucx_perftest           {perftest(a.iters):8.2f} us", flush=True)
    env = dict(os.environ, PYCOLL_TLS="ucx")
    cmd = [sys.executable, "-m", "pycoll", "run", "-n", "2", "--", sys.executable, __file__, "--rank",
           "--iters", str(a.iters)]
    return subprocess.run(cmd, env=env, timeout=600).returncode


if __name__ == "__main__":
    sys.exit(main())
