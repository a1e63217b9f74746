"""A user-written collective: recursive-doubling allreduce as a pycoll schedule.

This is the example of the UCC schedule/task slides, written with pycoll's public API: one task per
step, step i subscribed to step i-1's COMPLETED event, each step sending the running sum to the
peer ``rank ^ (1 << i)`` and adding what it receives. It runs on four in-process ranks
(``pycoll.local_teams``) and checks the result against numpy.

    python examples/custom_schedule.py
"""

from __future__ import annotations

import numpy as np

import pycoll
from pycoll import Schedule, Task


class RecursiveDoublingStep(Task):
    """Step ``step``: exchange ``dst`` with the peer ``rank ^ 2**step`` and add what arrives."""

    def __init__(self, team: pycoll.Team, step: int, dst: np.ndarray, scratch: np.ndarray) -> None:
        super().__init__(f"rd-step{step}", nbytes=dst.nbytes)
        self.team, self.step, self.dst, self.scratch = team, step, dst, scratch
        self.peer = team.rank ^ (1 << step)
        self.reqs = []

    def post(self) -> None:  # RD_STAGE_START: post the send and the receive
        self.reqs = [self.team.isend(self.dst, self.peer, tag=self.step),
                     self.team.irecv(self.scratch, self.peer, tag=self.step)]
        self.progress()

    def progress(self) -> None:  # RD_STAGE_PROGRESS: test both, then reduce and complete
        if all(req.test() for req in self.reqs):
            self.dst += self.scratch
            self.complete()


def recursive_doubling_allreduce(team: pycoll.Team, src: np.ndarray, dst: np.ndarray) -> Schedule:
    """Build (not start) the schedule for one rank; ``team.size`` must be a power of two."""
    assert team.size & (team.size - 1) == 0, "this example needs a power-of-two team"
    dst[:] = src
    scratch = np.empty_like(dst)
    schedule = Schedule(name=f"rd-allreduce@{team.rank}")
    previous = None
    for step in range(team.size.bit_length() - 1):
        task = RecursiveDoublingStep(team, step, dst, scratch)
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
    requests = [team.ctx.submit(recursive_doubling_allreduce(team, inputs[r], outputs[r]))
                for r, team in enumerate(teams)]
    pycoll.wait_all(requests)
    expected = np.sum(inputs, axis=0)
    for r in range(n):
        np.testing.assert_allclose(outputs[r], expected, rtol=1e-12)
    print(f"recursive-doubling allreduce on {n} in-process ranks matches numpy: {outputs[0][:3]} ...")


if __name__ == "__main__":
    main()
