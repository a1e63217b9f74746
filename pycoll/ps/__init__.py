"""BytePS push-sum-pull: summation servers and the optimal load split.

* :mod:`pycoll.ps.placement`: which summation service sums each partition (BytePS's split);
* :mod:`pycoll.algorithms.push_pull`: the worker's schedule (push, colocated sum, pull);
* :mod:`pycoll.ps.server`: the loop CPU-only server processes run.

Users call ``team.push_pull(buf, name=...)``; servers come from ``pycoll run -n N --servers K``
or ``PYCOLL_NUM_SERVERS``.
"""

from pycoll.ps.placement import plan, shares, slots

__all__ = ["plan", "shares", "slots"]
