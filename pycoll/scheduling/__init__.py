"""ByteScheduler-style communication scheduling: priority by layer, partitions, credit, auto-tuning.

::

    from pycoll.scheduling import Scheduler

    sched = Scheduler(team, partition_bytes="4M", credit_bytes="16M")
    h = sched.submit("fc1.weight", grad, priority=3)     # layer 3 from the input
    g = sched.submit("fc0.weight", grad0, priority=0, ready=False)
    sched.notify_ready("fc0.weight")                      # its data is there now
    h.wait(); g.wait()
    sched.step()                                          # end of a training step (tuning)

See :mod:`pycoll.scheduling.scheduler` for the rules and :mod:`pycoll.scheduling.tuning` for the
auto-tuner; :class:`pycoll.torch.ScheduledOptimizer` uses both for PyTorch training.
"""

from pycoll.scheduling.scheduler import IMMEDIATE, PART_STRIDE, ScheduledTensor, Scheduler
from pycoll.scheduling.tuning import AutoTuner

__all__ = ["AutoTuner", "IMMEDIATE", "PART_STRIDE", "ScheduledTensor", "Scheduler"]
