"""Mismatch campaign: ranks that disagree, on every transport and front end, at any call number
of a long-lived team. Target: 0 silent.

For each transport (the host's shared segment; MPI, TCP and UCX point to point, by
``PYCOLL_TLS``) this starts ``-n`` ranks under mpiexec. Each rank runs every kind of disagreement
through every front end (``pycoll.Team``, ``pycoll.mpi.Comm``, ``torch.distributed`` on backend
``pycoll``), the last rank calling differently from the others at call number N of a team
(group, communicator) that made N - 1 agreeing calls before (N of ``--calls``), then one more
agreeing call, and reports what each of the two did:

- ``raised``: the disagreeing call raised ``pycoll.MismatchError`` (for ``Comm`` an
  ``MPI.Exception`` of class ``MPI.ERR_TRUNCATE``, for torch a ``DistBackendError``, each also a
  ``MismatchError``);
- ``next``: it returned, and the next call raised the mismatch error (a rank whose part of the
  call received nothing that told it, a bcast's root: it learns at its next call, as
  :mod:`pycoll.agreement` promises);
- ``silent``: both returned (a result computed from arguments that do not agree; in the threads'
  cases a wrong sum, and no error at the next call either);
- ``right`` (the threads' cases only): no error and every result right: each rank's two threads
  took turns, in the same order on every rank (pycoll raises ThreadError when it sees them overlap);
- ``late`` (the threads' cases only): a wrong sum, then the mismatch error at the next call;
- ``other``: another error (a timeout included).

(torch's groups are made from a store, never from MPI: where ``PYCOLL_TLS`` names ``mpi`` alone,
they run over TCP; on ``tcp`` the Team front's teams are made from a store too.) A case passes
when every rank raised or learned at its next call. The table counts cases per transport and
front end; the exit status is 1 if any case did not pass.

Two threads' cases: ``two threads at once`` (on rank 0, thread B posts while thread A's first call
is in flight; the other ranks start theirs once rank 0's have posted) must raise like the others;
``threads taking turns`` (every rank's threads run free, and may take turns without overlapping,
in another order on each rank) is what no rank can see: its rows (front marked ``*``) are reported,
not counted.

    python benchmarks/mismatch.py              # 3 ranks; segment, mpi, tcp, ucx (if built); calls 1-100
    python benchmarks/mismatch.py --quick      # 2 ranks, segment and mpi, a few call numbers (the tests')
    python benchmarks/mismatch.py --tls mpi --fronts team --kinds "bcast root" --calls 9
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

FRONTS = ("team", "comm", "torch")
COLUMNS = ("cases", "raised", "next", "right", "late", "silent", "other")
#: The kind no rank can see (reported in rows of its own, not counted against the target).
UNSEEN = "threads taking turns"


# ------------------------------------------------------------------ one rank
#: The kinds of disagreement, in order (``--quick`` takes the first QUICK_KINDS and the v-form).
QUICK_KINDS = 6


def kinds(r: int, n: int, np: Any) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(kind, arguments of this rank): the last rank disagrees with the others."""
    odd = r == n - 1
    f32 = np.float32
    yield "count", {"coll": "allreduce", "count": 100 + odd, "dtype": f32, "op": "sum"}
    yield "dtype of one size", {"coll": "allreduce", "count": 100, "dtype": np.int32 if odd else f32,
                                "op": "sum"}
    yield "op", {"coll": "allreduce", "count": 100, "dtype": f32, "op": "max" if odd else "sum"}
    yield "bcast root", {"coll": "bcast", "count": 100, "dtype": f32, "root": n - 1 if odd else 0}
    yield "bcast count", {"coll": "bcast", "count": 100 + odd, "dtype": f32, "root": 0}
    yield "scan op", {"coll": "scan", "count": 100, "dtype": f32, "op": "max" if odd else "sum"}
    yield "allgatherv counts", {"coll": "allgatherv", "count": 10 + odd, "dtype": f32}
    yield "dtype", {"coll": "allreduce", "count": 100, "dtype": np.float64 if odd else f32, "op": "sum"}
    yield "reduce root", {"coll": "reduce", "count": 100, "dtype": f32, "op": "sum",
                          "root": n - 1 if odd else 0}
    yield "collective", {"coll": "bcast" if odd else "allreduce", "count": 100, "dtype": f32, "op": "sum",
                         "root": 0}
    yield "allgather count", {"coll": "allgather", "count": 10 + odd, "dtype": f32}
    yield "exscan op", {"coll": "exscan", "count": 100, "dtype": f32, "op": "max" if odd else "sum"}
    yield "large count", {"coll": "allreduce", "count": 300_000 + odd, "dtype": f32, "op": "sum"}
    yield "two threads at once", {"coll": "threads", "at_once": True}  # (overlapping on rank 0)
    yield "threads taking turns", {"coll": "threads", "at_once": False}  # (free running: reported only)


def threads_call(front: str, made: Any, np: Any, MPI: Any, at_once: bool) -> Optional[Callable[[], Any]]:
    """Two threads of this rank post 30 untagged allreduces each on ``made`` (values 1 and 100).
    ``at_once``: on rank 0, B posts while A's first call is in flight (the other ranks start their
    threads once rank 0's have posted); else the threads run free, and may take turns without ever
    overlapping, in another order on each rank. The call raises the first mismatch error a thread
    got; on a wrong sum it returns ``"wrong"``, or ``"wrong, then raised"`` when the rank's next
    call raised; ``"right"`` when every result was right (None: a front without threads' case)."""
    import threading

    import pycoll

    if front not in ("team", "comm"):
        return None
    world = MPI.COMM_WORLD
    n = world.size

    def post(x: Any, y: Any) -> Any:
        if front == "team":
            return made.allreduce(x, y)
        return made.Iallreduce(x, y, op=MPI.SUM)

    def one(value: float, got: List[Any], posted: Any) -> None:
        x, y = np.full(4, value, np.float32), np.empty(4, np.float32)
        try:
            for _ in range(30):
                req = post(x, y)
                posted.set()
                req.wait(timeout=20) if front == "team" else req.Wait()
                if not (y == n * value).all():
                    got.append(AssertionError(f"a wrong sum: {y[0]} where {n * value}"))
                    return
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            got.append(exc)
        finally:
            posted.set()

    def call() -> str:
        got: List[Any] = []
        posted = {"A": threading.Event(), "B": threading.Event()}
        ts = [threading.Thread(target=one, args=(v, got, posted[name]), name=name)
              for v, name in ((1.0, "A"), (100.0, "B"))]
        if at_once and world.rank != 0:
            world.recv(source=0, tag=77)  # (rank 0's threads have posted)
        for t, name in zip(ts, "AB"):
            t.start()
            if at_once and world.rank == 0:
                posted[name].wait(60)
        if at_once and world.rank == 0:
            for r in range(1, n):
                world.send(True, dest=r, tag=77)
        for t in ts:
            t.join(60)
        if any(isinstance(e, AssertionError) for e in got):
            if any(isinstance(e, pycoll.MismatchError) for e in got):
                return "wrong, then raised"
            try:
                agreeing(front, made, np, MPI)()
            except pycoll.MismatchError:
                return "wrong, then raised"
            except Exception:  # noqa: BLE001 - the wrong sum is what counts
                pass
            return "wrong"
        if got:
            raise got[0]
        return "right"

    return call


def _counts(a: Dict[str, Any], n: int) -> List[int]:
    """The allgatherv counts of every rank as a rank with arguments ``a`` sees them."""
    return [10] * (n - 1) + [a["count"]]


def team_call(team: Any, a: Dict[str, Any], np: Any) -> Callable[[], Any]:
    if a["coll"] == "threads":
        return lambda: None  # (see threads_call)
    x = np.ones(a["count"], a["dtype"])
    if a["coll"] in ("allreduce", "scan", "exscan"):
        return lambda: getattr(team, a["coll"])(x, op=a["op"]).wait(timeout=20)
    if a["coll"] == "bcast":
        return lambda: team.bcast(x, root=a["root"]).wait(timeout=20)
    if a["coll"] == "reduce":
        return lambda: team.reduce(x, np.empty_like(x), op=a["op"], root=a["root"]).wait(timeout=20)
    if a["coll"] == "allgatherv":
        counts = _counts(a, team.size)
        return lambda: team.allgatherv(x, np.empty(sum(counts), x.dtype), counts).wait(timeout=20)
    return lambda: team.allgather(x, np.empty(team.size * x.size, x.dtype)).wait(timeout=20)


def comm_call(comm: Any, a: Dict[str, Any], np: Any, MPI: Any) -> Callable[[], Any]:
    if a["coll"] == "threads":
        return lambda: None  # (see threads_call)
    x = np.ones(a["count"], a["dtype"])
    op = {"sum": MPI.SUM, "max": MPI.MAX}.get(a.get("op", "sum"))
    if a["coll"] in ("allreduce", "scan", "exscan"):
        method = {"allreduce": comm.Allreduce, "scan": comm.Scan, "exscan": comm.Exscan}[a["coll"]]
        return lambda: method(x, np.empty_like(x), op=op)
    if a["coll"] == "bcast":
        return lambda: comm.Bcast(x, root=a["root"])
    if a["coll"] == "reduce":
        return lambda: comm.Reduce(x, np.empty_like(x), op=op, root=a["root"])
    if a["coll"] == "allgatherv":
        counts = _counts(a, comm.Get_size())
        return lambda: comm.Allgatherv(x, [np.empty(sum(counts), x.dtype), counts])
    return lambda: comm.Allgather(x, np.empty(comm.Get_size() * x.size, x.dtype))


def torch_call(group: Any, a: Dict[str, Any], np: Any) -> Optional[Callable[[], Any]]:
    """The call through torch.distributed (None: torch has no such collective)."""
    import torch
    import torch.distributed as dist

    if a["coll"] == "threads":
        return None
    x = torch.from_numpy(np.ones(a["count"], a["dtype"]))
    op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}.get(a.get("op", "sum"))
    if a["coll"] == "allreduce":
        return lambda: dist.all_reduce(x, op=op, group=group)
    if a["coll"] == "bcast":
        return lambda: dist.broadcast(x, src=a["root"], group=group)
    if a["coll"] == "reduce":
        return lambda: dist.reduce(x, dst=a["root"], op=op, group=group)
    if a["coll"] == "allgather":
        out = torch.empty(dist.get_world_size() * x.numel(), dtype=x.dtype)
        return lambda: dist.all_gather_into_tensor(out, x, group=group)
    return None


def outcome(call: Callable[[], Any], front: str, MPI: Any) -> str:
    """What ``call`` did: ``raised`` (the front end's mismatch error), ``silent`` (it returned) or
    ``other: ...``."""
    import pycoll

    try:
        got = call()
    except pycoll.MismatchError as exc:
        if os.environ.get("MISMATCH_VERBOSE"):
            print(f"## {MPI.COMM_WORLD.rank}: {exc}", flush=True)
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
    threads = {"right": "right", "wrong": "silent", "wrong, then raised": "late"}
    return threads.get(got, "silent") if isinstance(got, str) else "silent"


def agreeing(front: str, made: Any, np: Any, MPI: Any) -> Callable[[], Any]:
    """An agreeing call of every rank (a small allreduce) on ``made`` (team, Comm or group)."""
    args = {"coll": "allreduce", "count": 4, "dtype": np.float32, "op": "sum"}
    if front == "team":
        return team_call(made, args, np)
    if front == "comm":
        return comm_call(made, args, np, MPI)
    return torch_call(made, args, np)  # type: ignore[return-value]


def rank_main(fronts: List[str], quick: bool, numbers: List[int], only: List[str]) -> None:
    import numpy as np
    from mpi4py import MPI

    from pycoll import Team
    from pycoll.mpi import Comm

    world = MPI.COMM_WORLD
    r, n = world.rank, world.size
    store = None
    if os.environ.get("PYCOLL_TLS") == "tcp":  # (a team from MPI keeps MPI's point to point)
        from pycoll.store import TCPStore

        port = world.bcast(TCPStore(port=0, is_master=True, timeout=60).port if r == 0 else None)
        store = TCPStore("127.0.0.1", port, timeout=60)
    if "torch" in fronts:
        import torch.distributed as dist

        import pycoll.torch  # noqa: F401 - registers the backend

        dist.init_process_group("gloo", rank=r, world_size=n)  # (the pycoll groups are made per case)
    cases = list(kinds(r, n, np))
    if quick:
        cases = cases[:QUICK_KINDS] + [c for c in cases if c[0] == "allgatherv counts"]
    if only:
        cases = [c for c in cases if c[0] in only]
    for front in fronts:
        for kind, args in cases:
            for number in (numbers if not quick or front == "team" else [9]):
                if front == "team":
                    made: Any = Team.from_mpi(world) if store is None else Team.from_store(store, r, n)
                    bad = team_call(made, args, np)
                elif front == "comm":
                    made = Comm(world)
                    bad = comm_call(made, args, np, MPI)
                else:
                    import torch.distributed as dist

                    made = dist.new_group(backend="pycoll")
                    bad = torch_call(made, args, np)  # type: ignore[assignment]
                if args["coll"] == "threads":
                    bad = threads_call(front, made, np, MPI, args["at_once"])
                if bad is not None:
                    good = agreeing(front, made, np, MPI)
                    result = None
                    for i in range(number - 1):
                        try:
                            good()
                        except Exception as exc:  # noqa: BLE001 - an agreeing call failed: the case says so
                            result = f"other: agreeing call {i + 1}: {type(exc).__name__}: {str(exc)[:300]}"
                            break
                    if args["coll"] == "threads" and args["at_once"]:  # (every rank starts it, or none)
                        started = world.allgather(result is None)
                        if not all(started) and result is None:  # (the others' agreeing calls failed)
                            idle = [i for i, ok in enumerate(started) if not ok]
                            result = f"other: not started on ranks {idle}"
                    if result is None:
                        result = outcome(bad, front, MPI)
                        if result in ("silent", "right") and args["coll"] != "threads":  # (learned next?)
                            after = outcome(good, front, MPI)
                            then = {"raised": "next", "silent": "silent"}.get(
                                after, f"{result}, then {after}")
                            result = "right" if result == "right" and after == "silent" else then
                    # (marked: mpiexec may join two ranks' lines)
                    rep = json.dumps({"rank": r, "front": front, "kind": kind, "number": number,
                                      "result": result})
                    print(f"@@{rep}@@", flush=True)
                if front == "team":
                    made.close()
                elif front == "comm":
                    made.team.close()
                else:
                    dist.destroy_process_group(made)
                world.Barrier()


# ------------------------------------------------------------------ the campaign
def call_numbers(text: str) -> List[int]:
    """``"1-100"``, ``"9"``, ``"1,9,50-52"`` as the call numbers they name."""
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


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
    ap.add_argument("--quick", action="store_true",
                    help=f"2 ranks, {QUICK_KINDS + 1} kinds, segment and mpi, calls 1, 9 and 50 (comm and "
                         "torch: 9)")
    ap.add_argument("--calls", default="1-100",
                    help="call numbers at which the ranks disagree: N, A-B, or a list of those "
                         "(default 1-100)")
    ap.add_argument("--fronts", default=",".join(FRONTS), help="front ends (default team,comm,torch)")
    ap.add_argument("--tls", default="", help="transports (segment, mpi, tcp, ucx; default: all there are)")
    ap.add_argument("--kinds", default="", help="the kinds of disagreement to run, by name (default: all)")
    ap.add_argument("--timeout", type=float, default=600, help="wall-clock limit per transport (s)")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    fronts = [f for f in args.fronts.split(",") if f]
    numbers = [1, 9, 50] if args.quick and args.calls == "1-100" else call_numbers(args.calls)
    if args.rank:
        rank_main(fronts, args.quick, numbers, [k for k in args.kinds.split(",") if k])
        return 0
    from pycoll.launch import find_mpiexec

    n = args.n or (2 if args.quick else 3)
    rows: Dict[Tuple[str, str], Dict[str, int]] = {}
    bad = []
    for name, extra in transports(args.quick):
        if args.tls and name not in args.tls.split(","):
            continue
        env = dict(os.environ, PYCOLL_TIMEOUT="20", PYCOLL_ABORT_ON_ERROR="0", **extra)
        cmd = [find_mpiexec(), "-n", str(n), sys.executable, __file__, "--rank", "--fronts", ",".join(fronts),
               "--calls", ",".join(map(str, numbers)), "--kinds", args.kinds]
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
        results: Dict[Tuple[str, str, int], List[str]] = {}
        for text in re.findall(r"@@(.*?)@@", out):
            rep = json.loads(text)
            results.setdefault((rep["front"], rep["kind"], rep["number"]), []).append(rep["result"])
        for (front, kind, number), got in sorted(results.items()):
            row = rows.setdefault((name, front + ("*" if kind == UNSEEN else "")), dict.fromkeys(COLUMNS, 0))
            row["cases"] += 1
            passed = len(got) == n and all(g in ("raised", "next") for g in got)
            if got == ["right"] * n:  # (threads that took turns alike on every rank: no harm done)
                passed, verdict = True, "right"
            else:
                verdict = ("raised" if got == ["raised"] * n else "next" if passed else
                           "silent" if "silent" in got else "late" if "late" in got else "other")
            row[verdict] += 1
            if not passed and kind != UNSEEN:
                bad.append(f"{name} {front} {kind} at call {number}: {got}")
        if rc != 0:
            bad.append(f"{name}: ranks exited with {rc} after {time.monotonic() - t0:.0f} s")
    print(f"{n} ranks, disagreeing at calls {args.calls if not args.quick else numbers}; a case is "
          "'raised' when every rank raised the mismatch error at the call, 'next' when every rank did "
          "at the call or at its next\n")
    print(f"{'transport':<10} {'front':<7}" + "".join(f" {c:>6}" for c in COLUMNS))
    for (name, front), row in rows.items():
        print(f"{name:<10} {front:<7}" + "".join(f" {row[c]:>6}" for c in COLUMNS))
    if any(front.endswith("*") for _, front in rows):
        print(f"\n*: {UNSEEN}, reported, not counted: a rank whose two threads never overlap cannot see "
              "that another rank's took turns in another order (docs/guide/team.md, Threads)")
    for line in bad:
        print("NOT RAISED:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
