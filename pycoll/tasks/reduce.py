"""The reduction primitive: ``out = a (op) b`` on typed arrays, as a task.

With :class:`~pycoll.tasks.p2p.SendTask`, :class:`~pycoll.tasks.p2p.RecvTask` and
:class:`~pycoll.tasks.task.CopyTask` it is one of the primitive tasks a schedule can be made of;
a schedule made of nothing else lowers to a program (:mod:`pycoll.lower`) that a transport's
native executor can run without Python per step.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from pycoll.ops import ReduceOp, finish_avg, reducer
from pycoll.tasks.task import Task


class ReduceTask(Task):
    """Computes ``out = a (op) b`` elementwise (``a``, ``b`` and ``out`` numpy arrays of one dtype
    and size; ``out`` may be ``a`` or ``b``). AVG reduces as SUM (divide at the end: ``divide_by``
    n makes this task divide ``out`` by n afterwards, as :func:`pycoll.ops.finish_avg` does). Takes
    no credit."""

    __slots__ = ("out", "a", "b", "op", "divide_by")
    takes_credit = False

    def __init__(self, out: np.ndarray, a: np.ndarray, b: np.ndarray, op: Any = ReduceOp.SUM, *,
                 name: Optional[str] = None, priority: Optional[int] = None, divide_by: int = 0) -> None:
        for what, arr in (("out", out), ("a", a), ("b", b)):
            if not isinstance(arr, np.ndarray) or arr.ndim != 1 or not arr.flags.c_contiguous:
                raise TypeError(f"ReduceTask: {what} must be a contiguous 1-D numpy array")
        if not a.dtype == b.dtype == out.dtype or not a.size == b.size == out.size:
            raise ValueError(f"ReduceTask: a, b and out differ ({a.size} x {a.dtype}, {b.size} x {b.dtype}, "
                             f"{out.size} x {out.dtype})")
        if not out.flags.writeable:
            raise ValueError("ReduceTask: out is read-only")
        super().__init__(name or "reduce", priority=priority, nbytes=out.nbytes)
        self.out, self.a, self.b = out, a, b
        self.op = op if isinstance(op, ReduceOp) else ReduceOp[str(op).upper()]
        if divide_by < 0:
            raise ValueError(f"ReduceTask: divide_by must be >= 0, got {divide_by}")
        self.divide_by = divide_by

    def post(self) -> None:
        reducer(self.op, self.out.dtype)(self.a, self.b, self.out)
        if self.divide_by:
            finish_avg(self.out, self.divide_by)
        self.complete()
