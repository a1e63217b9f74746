"""``pycoll sim --payload``: simulate with the data, and check the result against numpy.

Each rank's program is recorded on buffers that hold its input (small integers, exact in any
order of summation), and while the simulation runs every instruction does what it says when the
engine runs it (:func:`pycoll.sim.engine.run`'s ``payload``): a send takes a copy of its slice
when it is posted, a receive writes the message it matched when it is done, a reduction or copy
computes when it is issued (as the executors do: :class:`pycoll.lower.execute.ProgramTask`). At
the end every rank's output is compared with numpy's. Memory grows with the ranks times the size:
meant for up to a few hundred ranks. The composite allreduces (``ring``, ``rabenseifner``: two
programs in a row) are not run with data.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Tuple

import numpy as np

from pycoll.lower.execute import call_bytes, compute, kernels
from pycoll.lower.program import Program
from pycoll.lower.record import record
from pycoll.sim.engine import Compact
from pycoll.sim.programs import COMPOSITES, elements
from pycoll.team import local_teams

_REDUCE = {"sum": np.add.reduce, "max": np.maximum.reduce, "min": np.minimum.reduce,
           "prod": np.multiply.reduce}


def data(rank: int, count: int, dtype: Any) -> np.ndarray:
    """Rank ``rank``'s input: small integers, different per rank."""
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 3) % 11 - 5).astype(dtype)


class Payload:
    """The data of one simulation: each rank's buffers (by the names its program uses), the
    messages in flight, and what each rank must end with."""

    def __init__(self, coll: str, algorithm: str, size: int, nbytes: int, dtype: Any = "float32",
                 op: str = "sum", root: int = 0) -> None:
        if (coll, algorithm) in COMPOSITES:
            raise ValueError(f"--payload: {coll} {algorithm} is simulated as two programs in a row, "
                             "which do not run with data")
        dt = np.dtype(dtype)
        count = elements(coll, nbytes, size, dt.itemsize)
        self.programs: List[Program] = []
        self.bufs: List[Dict[str, np.ndarray]] = []
        self.calls: List[Any] = []
        inputs = [data(r, count * (size if coll in ("reduce_scatter", "alltoall", "scatter") else 1), dt)
                  for r in range(size)]
        self.inputs = inputs
        teams = local_teams(size)
        try:
            for team in teams:
                call = _call_with_data(team, coll, count, dt, op, root, inputs[team.rank])
                program = record(team, call, algorithm, compute=False)
                bufs = {name: np.zeros(n, np.uint8) for name, n in program.buffers.items()}
                for name in ("src", "dst"):
                    if name in program.buffers:
                        bufs[name] = call_bytes(call, name, program)
                self.programs.append(program)
                self.bufs.append(bufs)
                self.calls.append(call)
        finally:
            for team in teams:
                team.close()
        self.coll, self.op, self.root, self.count = coll, op, root, count
        self.compacts = [Compact.of(p) for p in self.programs]
        self._inbox: Dict[Tuple[int, int, int], Deque[np.ndarray]] = {}
        self._kernels = kernels([i for p in self.programs for i in p.instrs])

    def _view(self, r: int, s: tuple) -> np.ndarray:
        return self.bufs[r][s[0]][s[1]:s[1] + s[2]]

    def begin(self, r: int, i: int) -> None:
        """Rank ``r`` issues instruction ``i``."""
        ins = self.programs[r].instrs[i]
        if ins.kind == "send":
            message = self._view(r, ins.slices["buf"]).copy()
            self._inbox.setdefault((ins.peer, r, ins.step), deque()).append(message)
        elif ins.kind != "recv":
            compute(ins, lambda s: self._view(r, s), self._kernels)

    def done(self, r: int, i: int) -> None:
        """Rank ``r``'s instruction ``i`` is done: a receive takes its message."""
        ins = self.programs[r].instrs[i]
        if ins.kind == "recv":
            message = self._inbox[(r, ins.peer, ins.step)].popleft()
            self._view(r, ins.slices["buf"])[:message.size] = message

    def wrong(self) -> List[str]:
        """The ranks whose output differs from numpy's (empty: all right)."""
        coll, m, ins = self.coll, self.count, self.inputs
        total = _REDUCE[self.op](np.stack(ins)) if coll in ("allreduce", "reduce", "reduce_scatter") else None
        bad = []
        for r, call in enumerate(self.calls):
            out = call.dst
            if coll == "allreduce" or coll == "reduce" and r == self.root:
                want = total
            elif coll == "bcast":
                want = ins[self.root]
            elif coll == "allgather" or coll == "gather" and r == self.root:
                want = np.concatenate(ins)
            elif coll == "reduce_scatter":
                want = total[r * m:(r + 1) * m]
            elif coll == "alltoall":
                want = np.concatenate([x[r * m:(r + 1) * m] for x in ins])
            elif coll == "scatter":
                want = ins[self.root][r * m:(r + 1) * m]
            else:
                continue  # (a non-root of reduce and gather, a barrier: nothing to check)
            got = None if out is None else out.reshape(-1)
            if got is not None and got.dtype != want.dtype:  # (a bcast's call holds its bytes)
                got = got.view(want.dtype)
            if got is None or not np.array_equal(got, want):
                bad.append(f"rank {r}")
        return bad


def _call_with_data(team: Any, coll: str, count: int, dt: np.dtype, op: str, root: int,
                    mine: np.ndarray) -> Any:
    """The checked call of ``coll`` whose input is ``mine``."""
    n, r = team.size, team.rank
    z = np.zeros
    if coll == "allreduce":
        return team.call(coll, mine.copy(), z(count, dt), op)
    if coll == "reduce":
        return team.call(coll, mine.copy(), z(count, dt), op, root)
    if coll == "bcast":
        return team.call(coll, mine.copy() if r == root else z(count, dt), root)
    if coll == "allgather":
        return team.call(coll, mine.copy(), z(count * n, dt))
    if coll == "reduce_scatter":
        return team.call(coll, mine.copy(), z(count, dt), op)
    if coll == "alltoall":
        return team.call(coll, mine.copy(), z(count * n, dt))
    if coll == "gather":
        return team.call(coll, mine.copy(), z(count * n, dt) if r == root else None, root)
    if coll == "scatter":
        return team.call(coll, mine.copy() if r == root else None, z(count, dt), root)
    return team.call(coll)
