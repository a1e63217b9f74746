"""A user's recursive-doubling allreduce made of primitive tasks: lowered to a program and run by
the native executor, with the same bits as its Python form.

The schedule of ``examples/custom_schedule.py`` again, written with pycoll's primitive tasks only
(:class:`~pycoll.tasks.CopyTask`, :class:`~pycoll.tasks.SendTask`,
:class:`~pycoll.tasks.RecvTask`, :class:`~pycoll.tasks.ReduceTask`) and nothing computed by the
builder itself. Such a schedule *lowers*: :mod:`pycoll.lower` turns one rank's schedule into a
program (numbered instructions over the call's buffers and a scratch buffer), and an algorithm
module that declares ``LOWERABLE = True`` runs as that program wherever the team's transport has a
native executor (UCX): no Python per step. Elsewhere it runs as the schedule it is.

:func:`main` registers the algorithm twice, as ``rdprim`` (LOWERABLE) and ``rdprim_py`` (the same
builder, run in Python), checks on in-process ranks that its programs give the schedule's bits
(:func:`pycoll.lower.verify.lower`), prints rank 0's program, and, under ``mpiexec``, times both
forms and MPI's allreduce side by side at 8 bytes::

    python examples/lowered_schedule.py                                  # in process: checked, printed
    PYCOLL_TLS=ucx mpiexec -n 2 python examples/lowered_schedule.py      # + timed over UCX
"""

from __future__ import annotations

import sys
import time
import types

import numpy as np

import pycoll
import pycoll.algorithms
from pycoll import ReduceOp, Schedule
from pycoll.algorithms.base import CollArgs
from pycoll.tasks import CopyTask, RecvTask, ReduceTask, SendTask, Task


def schedule(args: CollArgs) -> Task:
    """Recursive doubling on a power-of-two team: copy ``src`` into ``dst`` (out of place), then at
    step i send ``dst`` to rank ``rank ^ 2**i``, receive the peer's into scratch and reduce it in."""
    if args.size & (args.size - 1):
        raise ValueError(f"rdprim: needs a power-of-two team (this one has {args.size} ranks)")
    if args.op is ReduceOp.AVG:
        raise ValueError("rdprim: no AVG (it would divide at the end)")
    ch, dst = args.channel, args.dst
    scratch = np.empty_like(dst)
    sched = Schedule(name=args.name)
    last = sched.add(CopyTask(dst, args.src)) if args.src is not dst else None
    for step in range(args.size.bit_length() - 1):
        peer = args.rank ^ (1 << step)
        send = sched.add(SendTask(ch, dst, peer, step), after=last)
        recv = sched.add(RecvTask(ch, scratch, peer, step), after=last)
        last = sched.add(ReduceTask(dst, dst, scratch, args.op), after=[send, recv])
    return sched


def _algorithm(name: str, lowerable: bool) -> types.SimpleNamespace:
    """An algorithm module's declarations (see pycoll.algorithms), without a file of its own."""
    return types.SimpleNamespace(NAME=name, COLLECTIVES=("allreduce",), OPTIONS={}, build=schedule,
                                 LOWERABLE=lowerable, __name__=f"examples.lowered_schedule:{name}")


def register() -> None:
    """``rdprim`` (run as a program where the transport can) and ``rdprim_py`` (always Python)."""
    pycoll.algorithms.register(_algorithm("rdprim", True), replace=True)
    pycoll.algorithms.register(_algorithm("rdprim_py", False), replace=True)


def main(n: int = 4) -> None:
    """On ``n`` in-process ranks: the programs give the schedule's bits; rank 0's program."""
    from pycoll.lower.verify import lower  # noqa: PLC0415 - the checked lowering

    register()
    for count, dtype, in_place in ((1, "float64", False), (1000, "float32", True), (333, "int32", False)):
        for op in ("sum", "max"):  # raises NotLowerable unless every rank's bits are the schedule's
            programs = lower("allreduce", "rdprim", n, count, dtype, op, in_place=in_place)
    programs = lower("allreduce", "rdprim", n, 1, "float64")
    print(f"rdprim lowers on {n} ranks, with the schedule's bits; rank 0's program for 1 x float64:")
    print(programs[0].dumps())


def timed(comm, iters: int = 2000) -> None:
    """Time an 8-byte allreduce: the program, the same schedule in Python, pycoll's own recursive
    doubling and MPI's (the same calls: a fresh output buffer of two, out of place)."""
    register()
    team = pycoll.Team.from_mpi(comm)
    x = np.ones(1, np.float64)
    results = {}
    ran = {}  # what ran each algorithm's last call: a native program's task, or the schedule
    for name in ("rdprim", "rdprim_py", "rd", "mpi"):
        bufs = [np.full(1, comm.rank + 1.0) for _ in range(2)]
        for i in range(iters // 10 + iters):
            if i == iters // 10:
                comm.Barrier()
                t0 = time.perf_counter()
            if name == "mpi":
                comm.Allreduce(x, bufs[i % 2])
            else:
                req = team.allreduce(x, bufs[i % 2], algorithm=name)
                req.wait()
                ran[name] = type(req.task).__name__
        results[name] = (time.perf_counter() - t0) / iters * 1e6
        assert bufs[0][0] == comm.size, (name, bufs)
    if comm.rank == 0:
        py, prog, rd, mpi = (results[k] for k in ("rdprim_py", "rdprim", "rd", "mpi"))
        native = ran["rdprim"] != ran["rdprim_py"]  # (no native executor: both run as the schedule)
        print(f"rdprim ran as {ran['rdprim']}, rdprim_py as {ran['rdprim_py']}")
        print(f"8 B allreduce on {comm.size} ranks over {team.transport.name}: "
              f"{'program' if native else 'rdprim (no native executor here)'} {prog:.2f} us, "
              f"Python schedule {py:.2f} us ({py / prog:.2f}x the program's time); pycoll's rd "
              f"{rd:.2f} us, MPI {mpi:.2f} us")
    team.close()


if __name__ == "__main__":
    from mpi4py import MPI  # only here: main() and the test that imports it need no MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        main()
    if MPI.COMM_WORLD.Get_size() > 1:
        timed(MPI.COMM_WORLD, int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
