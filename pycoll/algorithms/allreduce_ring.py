"""Ring allreduce: reduce-scatter then allgather around the ring (bandwidth-optimal: each rank
sends and receives 2(n-1)/n of the buffer).

The buffer is cut into ``n`` blocks; block ``b`` is reduced as it travels the ring and ends complete
on rank ``b - 1``, which starts it around again for the allgather. Every block is further cut into
fragments run through a :class:`~pycoll.tasks.PipelinedSchedule` (options ``fragment_bytes``:
the fragment of all blocks together; ``depth``: fragments in flight), so one fragment's
reductions overlap the next one's transfers. One fragment is a DAG of plain tasks, for step ``s``
of ``n - 1``::

    rs_recv[s] -> rs_reduce[s] -> rs_send[s+1]      (reduce-scatter: receive block r-s-1, add own)
    rs_reduce[n-2] -> ag_send[0];  ag_recv[s] -> ag_send[s+1]   (allgather: pass blocks on)
    rs_send[s] -> ag_recv[s]                        (a block is overwritten only once sent)
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from pycoll.algorithms.base import UNBOUND, CollArgs, as_wire, block_bounds, copy_in, finish, rebind_args
from pycoll.algorithms.options import Option, options
from pycoll.algorithms.patterns import fragment_count, fragment_elems
from pycoll.buffers import scratch_array
from pycoll.ops import ReduceOp, finish_avg, reduce_into
from pycoll.tasks import CopyTask, FunctionTask, PipelinedSchedule, PipelineOrder, ReduceTask, Schedule, Task
from pycoll.tasks.p2p import RecvTask, SendTask

NAME = "ring"
COLLECTIVES = ("allreduce",)
#: Bytes of one pipeline fragment (all blocks together) and fragments in flight.
FRAGMENT_BYTES = 1 << 20
DEPTH = 2
OPTIONS: Dict[str, Option] = {
    "fragment_bytes": Option(FRAGMENT_BYTES, "bytes of one pipeline fragment (its piece of every block "
                                             "together): smaller fragments overlap more, cost more messages"),
    "depth": Option(DEPTH, "fragments in flight at once"),
}


class _Reduce(FunctionTask):
    """``out = received (op) own`` on one block fragment (and AVG's division on the last step)."""

    def __init__(self, op: ReduceOp, divide_by: int, name: str) -> None:
        super().__init__(self._reduce, name=name)
        self.op = op
        self.divide_by = divide_by
        self.received = self.own = self.out = np.empty(0)

    def unbind(self) -> None:
        self.own = self.out = UNBOUND

    def finalize(self) -> None:
        self.received = self.own = self.out = UNBOUND

    def _reduce(self) -> None:
        reduce_into(self.received, self.own, self.op, out=self.out)
        if self.divide_by:
            finish_avg(self.out, self.divide_by)


class _Slot:
    """The tasks and scratch of one fragment slot."""

    def __init__(self, args: CollArgs, frag_elems: int, slot: int) -> None:
        n = args.size
        self.schedule = Schedule(name=f"{args.name}/frag{slot}")
        self.scratch = scratch_array((n - 1) * frag_elems, args.dst.dtype)
        ch, rank = args.channel, args.rank
        left, right = (rank - 1) % n, (rank + 1) % n
        empty = np.empty(0, np.uint8)
        add = self.schedule.add
        self.rs_recv: List[RecvTask] = []
        self.rs_send: List[SendTask] = []
        self.rs_red: List[_Reduce] = []
        self.ag_send: List[SendTask] = []
        self.ag_recv: List[RecvTask] = []
        for s in range(n - 1):
            self.rs_recv.append(add(RecvTask(ch, empty, left, 0, name=f"rs_recv{s}")))
            self.rs_send.append(add(SendTask(ch, empty, right, 0, name=f"rs_send{s}"),
                                    after=self.rs_red[s - 1] if s else None))
            divide = n if (s == n - 2 and args.op is ReduceOp.AVG) else 0
            self.rs_red.append(add(_Reduce(args.op, divide, f"rs_reduce{s}"), after=self.rs_recv[s]))
        for s in range(n - 1):
            self.ag_recv.append(add(RecvTask(ch, empty, left, 0, name=f"ag_recv{s}"),
                                    after=self.rs_send[s]))
            self.ag_send.append(add(SendTask(ch, empty, right, 0, name=f"ag_send{s}"),
                                    after=self.ag_recv[s - 1] if s else self.rs_red[n - 2]))


def _point(task, buf: np.ndarray, step: int) -> None:
    task.buf = as_wire(buf)
    task.nbytes = task.buf.nbytes
    task.tag = step


class RingAllreduce(PipelinedSchedule):
    """One rank's ring allreduce; reusable for calls of the same shape (:meth:`rebind`)."""

    def __init__(self, args: CollArgs, fragment_bytes: int, depth: int) -> None:
        n = args.size
        self.args = args
        self.bounds = block_bounds(args.count, n)
        longest = self.bounds[1] - self.bounds[0]
        # (no longer than a block: each slot's scratch is n - 1 fragments, and a kept collective
        # keeps it, so it must not outgrow the buffer it serves)
        self.frag_elems = min(fragment_elems(fragment_bytes, n * args.dst.itemsize), max(1, longest))
        self._slots: dict = {}
        # (a marked call with nothing to move still sends its one empty fragment: see CollArgs)
        self.nfrags = fragment_count(longest, self.frag_elems) or int(args.marked)
        super().__init__(self.nfrags, self._make, self._setup, depth=depth,
                         order=PipelineOrder.PARALLEL, name=args.name)
        # the fragments' sizes are set when they start: the collective as a whole moves the
        # buffer, and takes that much credit as one unit (every rank's first move is a send)
        self.nbytes = args.nbytes

    sends_first = True

    def _make(self, slot: int) -> Task:
        state = _Slot(self.args, self.frag_elems, slot)
        self._slots[state.schedule] = state
        return state.schedule

    def fragment_view(self, arr: np.ndarray, block: int, frag: int) -> np.ndarray:
        """Fragment ``frag`` of block ``block`` of ``arr`` (empty past the block's end)."""
        lo = self.bounds[block] + frag * self.frag_elems
        hi = min(self.bounds[block + 1], lo + self.frag_elems)
        return arr[lo:max(lo, hi)]

    def _setup(self, schedule: Task, frag: int) -> None:
        st, a, view = self._slots[schedule], self.args, self.fragment_view
        n, rank, src, dst, fe = a.size, a.rank, a.src, a.dst, self.frag_elems
        base = frag * 2 * (n - 1)
        for s in range(n - 1):
            b_send, b_recv = (rank - s) % n, (rank - s - 1) % n
            recv_view = view(dst, b_recv, frag)
            scratch = st.scratch[s * fe: s * fe + recv_view.size]
            _point(st.rs_recv[s], scratch, base + s)
            _point(st.rs_send[s], view(src if s == 0 else dst, b_send, frag), base + s)
            red = st.rs_red[s]
            red.received, red.own, red.out = scratch, view(src, b_recv, frag), recv_view
            _point(st.ag_send[s], view(dst, (rank + 1 - s) % n, frag), base + n - 1 + s)
            _point(st.ag_recv[s], view(dst, (rank - s) % n, frag), base + n - 1 + s)

    def rebind(self, src: np.ndarray, dst: np.ndarray, key: tuple) -> None:
        """Reuse this finished schedule (its slots and scratch) for a new call of the same shape."""
        rebind_args(self.args, src, dst, key)
        self.reset()

    def unbind(self) -> None:
        self.args.src = self.args.dst = UNBOUND
        super().unbind()  # (each start points the slots' tasks at its fragment again)

    @property
    def scratch_bytes(self) -> int:  # type: ignore[override]
        """The slots' scratch."""
        return sum(st.scratch.nbytes for st in self._slots.values())

    def finalize(self) -> None:
        """Drop the slots and their scratch (the schedule will not run again)."""
        super().finalize()
        self._slots.clear()

    def describe(self) -> str:
        return f"{super().describe()} {self.args.channel!r}"


class _Trivial(Task):
    """A team of one, or nothing to reduce."""

    takes_credit = False
    sends_first = False  # sends nothing: holds no credit as a unit (see Team._unit)

    def __init__(self, args: CollArgs) -> None:
        super().__init__(args.name, nbytes=args.nbytes)
        self.args = args

    def post(self) -> None:
        copy_in(self.args)
        finish(self.args)
        self.complete()

    def rebind(self, src: np.ndarray, dst: np.ndarray, key: tuple) -> None:
        rebind_args(self.args, src, dst, key)
        self.reset()

    def unbind(self) -> None:
        self.args.src = self.args.dst = UNBOUND


def lowered(args: CollArgs) -> Task:
    """The same ring as a :class:`~pycoll.tasks.Schedule` of primitive tasks, for lowering
    (:mod:`pycoll.lower`): every fragment's DAG of :class:`_Slot` on its views, with the same
    steps, so that a rank running the program and one running :class:`RingAllreduce` exchange the
    same messages, and the reductions as :class:`~pycoll.tasks.ReduceTask` (the same operands,
    AVG's division on the last one). Fragment ``f`` uses the scratch of slot ``f % depth``: its
    receives wait for the reductions of the fragment before it in that slot. The tasks are added
    step by step across the fragments (every fragment's first receive, then every fragment's first
    send, ...), so that a program, whose instructions an executor issues in order, has the
    fragments' transfers in flight together while it reduces, as the pipeline does."""
    opts = options(args, OPTIONS)
    sched = Schedule(name=f"{args.name}/lowered")
    n, rank, src, dst = args.size, args.rank, args.src, args.dst
    if n == 1 or (args.count == 0 and not args.marked):
        if src is not dst and dst.size:
            sched.add(CopyTask(dst, src))
        return sched
    ring = RingAllreduce(args, opts["fragment_bytes"], opts["depth"])  # (its fragments' geometry)
    fe, depth, ch = ring.frag_elems, max(1, opts["depth"]), args.channel
    left, right = (rank - 1) % n, (rank + 1) % n
    scratch = [scratch_array((n - 1) * fe, dst.dtype) for _ in range(min(depth, ring.nfrags))]
    last_reduce: Dict[tuple, Task] = {}  # (slot, step) -> the reduction that last read that scratch
    view = ring.fragment_view
    fragments: List[List[Task]] = []  # each fragment's tasks, in the order of its DAG

    def task(made: Task, after: Optional[Task], tasks: List[Task]) -> Task:
        if after is not None:
            made.depends_on(after)
        tasks.append(made)
        return made

    for f in range(ring.nfrags):
        base, slot, tasks = f * 2 * (n - 1), f % len(scratch), []
        rs_send: List[Task] = []
        red: Optional[Task] = None
        for s in range(n - 1):
            b_send, b_recv = (rank - s) % n, (rank - s - 1) % n
            out = view(dst, b_recv, f)
            received = scratch[slot][s * fe: s * fe + out.size]
            recv = task(RecvTask(ch, as_wire(received), left, base + s), last_reduce.get((slot, s)), tasks)
            sent = view(src if s == 0 else dst, b_send, f)
            rs_send.append(task(SendTask(ch, as_wire(sent), right, base + s), red, tasks))
            divide = n if (s == n - 2 and args.op is ReduceOp.AVG) else 0
            red = last_reduce[(slot, s)] = task(ReduceTask(out, received, view(src, b_recv, f), args.op,
                                                           divide_by=divide), recv, tasks)
        ag_recv: Optional[Task] = None
        for s in range(n - 1):
            step = base + n - 1 + s
            passed = view(dst, (rank + 1 - s) % n, f)
            task(SendTask(ch, as_wire(passed), right, step), ag_recv if s else red, tasks)
            ag_recv = task(RecvTask(ch, as_wire(view(dst, (rank - s) % n, f)), left, step), rs_send[s], tasks)
        fragments.append(tasks)
    for position in range(len(fragments[0])):  # (every fragment has as many)
        for tasks in fragments:
            sched.add(tasks[position])
    return sched


def build(args: CollArgs) -> Task:
    opts = options(args, OPTIONS)
    if args.size == 1 or (args.count == 0 and not args.marked):
        return _Trivial(args)
    return RingAllreduce(args, opts["fragment_bytes"], opts["depth"])
