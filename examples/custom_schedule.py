"""A user-written collective: recursive-doubling allreduce as a pycoll schedule, written, registered
as an algorithm, selected by a tune string and traced.

1. **Written.** This is the example of the UCC schedule/task slides, with pycoll's public API: one
   task per step, step i subscribed to step i-1's COMPLETED event, each step sending the running
   sum to the peer ``rank ^ (1 << i)`` and adding what it receives. :func:`main` runs it on four
   in-process ranks (``pycoll.local_teams``), submitted by hand, and checks it against numpy.
2. **Registered.** :func:`build` makes the same schedule from what pycoll hands an algorithm (a
   ``CollArgs``: buffers, rank, size and a channel keyed by the collective, so that collectives
   in flight together never match each other's messages); :func:`register` adds it to pycoll's
   algorithms as ``allreduce`` algorithm ``rdsched``.
3. **Selected by a tune string.** ``PYCOLL_TUNE=allreduce:0-64K:rdsched`` puts a rule in front of
   the default selection table: every allreduce below 64 KiB now runs the schedule, without an
   ``algorithm=`` argument; larger ones still take the defaults.
4. **Traced.** ``PYCOLL_TRACE`` makes every rank write a Chrome/Perfetto timeline; :func:`traced`
   reads it back and prints the tasks the engine ran: the collective and its steps.

    python examples/custom_schedule.py                # 1 on four in-process ranks
    mpiexec -n 2 python examples/custom_schedule.py   # 1, then 2-4 on the MPI ranks (a power of two)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

import pycoll
import pycoll.algorithms
import pycoll.trace
from pycoll import ReduceOp, Schedule, Task
from pycoll.algorithms.base import CollArgs
from pycoll.tl.base import Channel

#: What a module in pycoll/algorithms/ declares to be an algorithm (see pycoll/algorithms/__init__.py):
#: its name, the collectives it serves and the options it takes (keyword arguments of the call).
NAME = "rdsched"
COLLECTIVES = ("allreduce",)
OPTIONS: dict = {}
TUNE = f"allreduce:0-64K:{NAME}"  # PYCOLL_TUNE: this algorithm for allreduces below 64 KiB


class RecursiveDoublingStep(Task):
    """Step ``step``: exchange ``dst`` with the peer ``rank ^ 2**step`` and add what arrives.

    Messages go through a *channel*: point to point on a team's transport (``isend``/``irecv`` of
    bytes, returning requests to ``test()``), every message keyed by the channel's key and a step
    number. Run by hand, the schedule takes a key of its own; registered as an algorithm, it gets
    its collective's, so that collectives in flight together never match each other's messages."""

    #: A step is part of a collective, and a collective takes credit (PYCOLL_CREDIT_BYTES) as a
    #: whole: its steps take none of their own (the default is for a task that is a collective).
    takes_credit = False

    def __init__(self, channel: Channel, rank: int, step: int, dst: np.ndarray, scratch: np.ndarray) -> None:
        super().__init__(f"rd-step{step}", nbytes=dst.nbytes)
        self.channel, self.step, self.dst, self.scratch = channel, step, dst, scratch
        self.peer = rank ^ (1 << step)
        self.reqs = []

    def post(self) -> None:  # RD_STAGE_START: post the send and the receive (byte views)
        self.reqs = [self.channel.isend(self.dst.view(np.uint8), self.peer, self.step),
                     self.channel.irecv(self.scratch.view(np.uint8), self.peer, self.step)]
        self.progress()

    def progress(self) -> None:  # RD_STAGE_PROGRESS: test both, then reduce and complete
        if all(req.test() for req in self.reqs):
            self.dst += self.scratch
            self.complete()


def recursive_doubling_allreduce(channel: Channel, rank: int, size: int, src: np.ndarray, dst: np.ndarray,
                                 name: str = "") -> Schedule:
    """Build (not start) the schedule for one rank; ``size`` must be a power of two."""
    assert size & (size - 1) == 0, "this example needs a power-of-two team"
    dst[:] = src
    scratch = np.empty_like(dst)
    schedule = Schedule(name=name or f"rd-allreduce@{rank}")
    previous = None
    for step in range(size.bit_length() - 1):
        task = RecursiveDoublingStep(channel, rank, step, dst, scratch)
        if previous is not None:
            # ucc_event_manager_subscribe(&prev.em, UCC_EVENT_COMPLETED, task) in the slides: step i
            # subscribes to step i-1's COMPLETED event and starts when it arrives (and is canceled
            # if step i-1 fails). schedule.add(task, after=previous) says the same in one call.
            task.depends_on(previous, pycoll.Event.COMPLETED)
        schedule.add(task)
        previous = task
    return schedule


def main(n: int = 4, count: int = 10) -> None:
    teams = pycoll.local_teams(n)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(count) for _ in range(n)]
    outputs = [np.empty(count) for _ in range(n)]
    requests = []
    for r, team in enumerate(teams):
        channel = team.transport.channel(("rd",))  # this schedule's messages: ("rd", step)
        schedule = recursive_doubling_allreduce(channel, team.rank, team.size, inputs[r], outputs[r])
        requests.append(team.ctx.submit(schedule))  # the team's engine runs it
    pycoll.wait_all(requests)
    expected = np.sum(inputs, axis=0)
    for r in range(n):
        np.testing.assert_allclose(outputs[r], expected, rtol=1e-12)
    print(f"recursive-doubling allreduce on {n} in-process ranks matches numpy: {outputs[0][:3]} ...")


# ---------------------------------------------------------------- 2. registered as an algorithm
def build(args: CollArgs) -> Task:
    """The algorithm's builder: pycoll calls it with the checked arguments of one allreduce (typed
    1-D views ``args.src``, ``args.dst``: the same array when in place) and submits what it returns
    with the call's priority, tag and timeout. Arguments it cannot take raise here, before anything
    is sent, and the caller gets the error."""
    if args.op is not ReduceOp.SUM:
        raise ValueError(f"{NAME}: only SUM (got {args.op.name})")
    if args.size & (args.size - 1):
        raise ValueError(f"{NAME}: needs a power-of-two team (this one has {args.size} ranks)")
    return recursive_doubling_allreduce(args.channel, args.rank, args.size, args.src, args.dst,
                                        name=args.name)


def register() -> None:
    """Add this module's algorithm (its NAME, COLLECTIVES, OPTIONS and build) to pycoll's tables, as
    if it were a file in pycoll/algorithms/ (those are found when pycoll.algorithms is imported)."""
    pycoll.algorithms.register(sys.modules[__name__], replace=True)  # (replace: a second call is fine)


# ---------------------------------------------------------------- 3 and 4. selected and traced
def traced(comm) -> None:
    """On the MPI ranks of ``comm``: register, select by ``PYCOLL_TUNE``, trace, print the tasks."""
    rank = comm.Get_rank()
    # Settings are read from the environment when they are used; a launcher would set these
    # (PYCOLL_TUNE=... PYCOLL_TRACE=... mpiexec ...). They must be there before the team is made.
    os.environ["PYCOLL_TUNE"] = TUNE
    if not os.environ.get("PYCOLL_TRACE"):  # (the same on every rank) default: a new temp dir
        trace_dir = comm.bcast(tempfile.mkdtemp(prefix="pycoll-trace-") if rank == 0 else None)
        os.environ["PYCOLL_TRACE"] = os.path.join(trace_dir, "trace.json")
    register()
    team = pycoll.Team.from_mpi(comm)

    small = np.full(1000, rank + 1.0)  # 8000 B: the tune string selects rdsched
    team.allreduce(small).wait()
    large = np.full(16 << 10, rank + 1.0)  # 128 KiB: past the rule, the default table decides
    team.allreduce(large).wait()
    want = sum(range(1, team.size + 1))
    assert np.all(small == want) and np.all(large == want)

    path = pycoll.trace.flush()  # (also written at exit) this rank's trace.rank<r>.json
    comm.Barrier()
    if rank == 0:
        with open(path) as f:
            spans = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        print(f"rank 0's trace ({path}), {team.size} ranks, PYCOLL_TUNE={TUNE}:")
        # comm: what the engine started (collectives, their steps); subtask: tasks inside them. A
        # "(checked)" collective is one of a team's first: pycoll puts a check that every rank made
        # the same call in front of it (an allgather of a fingerprint; PYCOLL_CHECK).
        for e in sorted(spans, key=lambda e: e["ts"]):
            if e["cat"] in ("comm", "subtask"):
                print(f"  {e['cat']:<8} {e['name']:<30} {e['args']['nbytes']:>7} B {e['dur']:9.1f} us")
        names = {e["name"] for e in spans}
        assert f"allreduce:{NAME}@0" in names and "rd-step0" in names, names
        print(f"the 8000 B allreduce ran {NAME} (selected by PYCOLL_TUNE), the 128 KiB one "
              f"{sorted(n for n in names if n.startswith('allreduce:') and NAME not in n)}", flush=True)


if __name__ == "__main__":
    from mpi4py import MPI  # only here: main() and the test that imports it need no MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        main()
    if MPI.COMM_WORLD.Get_size() > 1:
        traced(MPI.COMM_WORLD)
