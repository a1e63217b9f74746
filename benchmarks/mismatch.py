"""Mismatch campaign: ranks that disagree, on every transport and front end. Target: 0 silent.

For each transport (the host's shared segment; MPI, TCP and UCX point to point, by
``PYCOLL_TLS``) this starts ``-n`` ranks under mpiexec. Each rank runs every kind of disagreement
through every front end (``pycoll.Team``, ``pycoll.mpi.Comm``, ``torch.distributed`` on backend
``pycoll``), the last rank calling differently from the others, on a fresh team (group,
communicator) per case, and reports what its call did:

- ``raised``: ``pycoll.MismatchError`` (for ``Comm`` an ``MPI.Exception`` of class
  ``MPI.ERR_TRUNCATE``, for torch a ``DistBackendError``, each also a ``MismatchError``);
- ``silent``: the call returned (a result computed from arguments that do not agree);
- ``other``: another error (a timeout included).

(torch's groups are made from a store, never from MPI: where ``PYCOLL_TLS`` names ``mpi`` alone,
they run over TCP.) A case passes when every rank raised. The table counts cases per transport
and front end; the exit status is 1 if any case was not raised on every rank.

    python benchmarks/mismatch.py              # 3 ranks; segment, mpi, tcp (and ucx if built)
    python benchmarks/mismatch.py --quick      # 2 ranks, segment and mpi (the test suite's)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Tuple

FRONTS = ("team", "comm", "torch")


# ------------------------------------------------------------------ one rank
def kinds(r: int, n: int, np: Any) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(kind, arguments of this rank): the last rank disagrees with the others."""
    odd = r == n - 1
    f32 = np.float32
    yield "count", {"coll": "allreduce", "count": 100 + odd, "dtype": f32, "op": "sum"}
    yield "dtype", {"coll": "allreduce", "count": 100, "dtype": np.float64 if odd else f32, "op": "sum"}
    yield "dtype of one size", {"coll": "allreduce", "count": 100, "dtype": np.int32 if odd else f32,
                                "op": "sum"}
    yield "op", {"coll": "allreduce", "count": 100, "dtype": f32, "op": "max" if odd else "sum"}
    yield "bcast root", {"coll": "bcast", "count": 100, "dtype": f32, "root": n - 1 if odd else 0}
    yield "reduce root", {"coll": "reduce", "count": 100, "dtype": f32, "op": "sum",
                          "root": n - 1 if odd else 0}
    yield "collective", {"coll": "bcast" if odd else "allreduce", "count": 100, "dtype": f32, "op": "sum",
                         "root": 0}
    yield "allgather count", {"coll": "allgather", "count": 10 + odd, "dtype": f32}
    yield "large count", {"coll": "allreduce", "count": 300_000 + odd, "dtype": f32, "op": "sum"}


def team_call(team: Any, a: Dict[str, Any], np: Any) -> Callable[[], Any]:
    x = np.ones(a["count"], a["dtype"])
    if a["coll"] == "allreduce":
        return lambda: team.allreduce(x, op=a["op"]).wait(timeout=20)
    if a["coll"] == "bcast":
        return lambda: team.bcast(x, root=a["root"]).wait(timeout=20)
    if a["coll"] == "reduce":
        return lambda: team.reduce(x, np.empty_like(x), op=a["op"], root=a["root"]).wait(timeout=20)
    return lambda: team.allgather(x, np.empty(team.size * x.size, x.dtype)).wait(timeout=20)


def comm_call(comm: Any, a: Dict[str, Any], np: Any, MPI: Any) -> Callable[[], Any]:
    x = np.ones(a["count"], a["dtype"])
    op = {"sum": MPI.SUM, "max": MPI.MAX}.get(a.get("op", "sum"))
    if a["coll"] == "allreduce":
        return lambda: comm.Allreduce(x, np.empty_like(x), op=op)
    if a["coll"] == "bcast":
        return lambda: comm.Bcast(x, root=a["root"])
    if a["coll"] == "reduce":
        return lambda: comm.Reduce(x, np.empty_like(x), op=op, root=a["root"])
    return lambda: comm.Allgather(x, np.empty(comm.Get_size() * x.size, x.dtype))


def torch_call(group: Any, a: Dict[str, Any], np: Any) -> Callable[[], Any]:
    import torch
    import torch.distributed as dist

    x = torch.from_numpy(np.ones(a["count"], a["dtype"]))
    op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}.get(a.get("op", "sum"))
    if a["coll"] == "allreduce":
        return lambda: dist.all_reduce(x, op=op, group=group)
    if a["coll"] == "bcast":
        return lambda: dist.broadcast(x, src=a["root"], group=group)
    if a["coll"] == "reduce":
        return lambda: dist.reduce(x, dst=a["root"], op=op, group=group)
    out = torch.empty(dist.get_world_size() * x.numel(), dtype=x.dtype)
    return lambda: dist.all_gather_into_tensor(out, x, group=group)


def outcome(call: Callable[[], Any], front: str, MPI: Any) -> str:
    import pycoll

    try:
        call()
    except pycoll.MismatchError as exc:
        truncate = isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE
        if front == "comm" and not truncate:
            return f"other: {type(exc).__name__} is not MPI.ERR_TRUNCATE"
        if front == "torch":
            import torch.distributed as dist

            if not isinstance(exc, dist.DistBackendError):
                return f"other: {type(exc).__name__} is not a DistBackendError"
        return "raised"
    except Exception as exc:  # noqa: BLE001 - reported, the campaign goes on
        return f"other: {type(exc).__name__}: {str(exc)[:120]}"
    return "silent"


def rank_main(fronts: List[str], quick: bool) -> None:
    import numpy as np
    from mpi4py import MPI

    from pycoll import Team
    from pycoll.mpi import Comm

    world = MPI.COMM_WORLD
    r, n = world.rank, world.size
    if "torch" in fronts:
        import torch.distributed as dist

        import pycoll.torch  # noqa: F401 - registers the backend

        dist.init_process_group("gloo", rank=r, world_size=n)  # (the pycoll groups are made per case)
    cases = list(kinds(r, n, np))
    if quick:
        cases = cases[:5]
    for front in fronts:
        for kind, args in cases:
            if front == "team":
                team = Team.from_mpi(world)
                result = outcome(team_call(team, args, np), front, MPI)
                team.close()
            elif front == "comm":
                comm = Comm(world)
                result = outcome(comm_call(comm, args, np, MPI), front, MPI)
                comm.team.close()
            else:
                import torch.distributed as dist

                group = dist.new_group(backend="pycoll")
                result = outcome(torch_call(group, args, np), front, MPI)
            # (marked: mpiexec may join two ranks' lines)
            rep = json.dumps({"rank": r, "front": front, "kind": kind, "result": result})
            print(f"@@{rep}@@", flush=True)
            world.Barrier()


# ------------------------------------------------------------------ the campaign
def transports(quick: bool) -> List[Tuple[str, Dict[str, str]]]:
    out = [("segment", {"PYCOLL_TLS": "shm,mpi"}), ("mpi", {"PYCOLL_TLS": "mpi"})]
    if quick:
        return out
    out.append(("tcp", {"PYCOLL_TLS": "tcp"}))
    try:
        from pycoll.tl.ucx import info

        info()  # (raises where UCX cannot be loaded)
        out.append(("ucx", {"PYCOLL_TLS": "ucx"}))
    except Exception:  # noqa: BLE001 - no UCX here: the others still run
        pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, help="ranks (default 3; 2 with --quick)")
    ap.add_argument("--quick", action="store_true", help="2 ranks, 5 kinds, segment and mpi")
    ap.add_argument("--fronts", default=",".join(FRONTS), help="front ends (default team,comm,torch)")
    ap.add_argument("--timeout", type=float, default=600, help="wall-clock limit per transport (s)")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    fronts = [f for f in args.fronts.split(",") if f]
    if args.rank:
        rank_main(fronts, args.quick)
        return 0
    from pycoll.launch import find_mpiexec

    n = args.n or (2 if args.quick else 3)
    rows: Dict[Tuple[str, str], Dict[str, int]] = {}
    bad = []
    for name, extra in transports(args.quick):
        env = dict(os.environ, PYCOLL_TIMEOUT="20", PYCOLL_ABORT_ON_ERROR="0", **extra)
        cmd = [find_mpiexec(), "-n", str(n), sys.executable, __file__, "--rank", "--fronts", ",".join(fronts)]
        if args.quick:
            cmd.append("--quick")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout,
                                  start_new_session=True)
            out, rc = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as exc:
            got = exc.stdout or ""
            out, rc = got.decode() if isinstance(got, bytes) else got, "timeout"
        results: Dict[Tuple[str, str], List[str]] = {}
        for text in re.findall(r"@@(.*?)@@", out):
            rep = json.loads(text)
            results.setdefault((rep["front"], rep["kind"]), []).append(rep["result"])
        for (front, kind), got in sorted(results.items()):
            row = rows.setdefault((name, front), {"cases": 0, "raised": 0, "silent": 0, "other": 0})
            row["cases"] += 1
            verdict = "raised" if got == ["raised"] * n else "silent" if "silent" in got else "other"
            row[verdict] += 1
            if verdict != "raised":
                bad.append(f"{name} {front} {kind}: {got}")
        if rc != 0:
            bad.append(f"{name}: ranks exited with {rc} after {time.monotonic() - t0:.0f} s")
    print(f"{n} ranks; a case is 'raised' when every rank raised the mismatch error\n")
    print(f"{'transport':<10} {'front':<6} {'cases':>5} {'raised':>6} {'silent':>6} {'other':>5}")
    for (name, front), row in rows.items():
        print(f"{name:<10} {front:<6} {row['cases']:>5} {row['raised']:>6} {row['silent']:>6} "
              f"{row['other']:>5}")
    for line in bad:
        print("NOT RAISED:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
