"""The ``pycoll`` torch.distributed backend: a Python ``ProcessGroup`` over a pycoll :class:`~pycoll.Team`.

Every torch collective maps to one pycoll collective (or one per tensor of a list) on the team that
``Team.from_store`` builds from the c10d store torch hands to the backend, so the backend runs under
``torchrun`` (env://) as well as under ``mpiexec``/``pycoll run``. Tensors are used in place through
numpy views of their memory; a non-contiguous tensor is copied into a contiguous one and the result
copied back when the collective finishes. List-shaped torch outputs (``all_gather`` into a list of
tensors, ``gather``) are received into one flat buffer and copied out at completion.

Each call returns a :class:`PycollWork`. Its ``wait()`` drives pycoll's engine in the caller's thread
(the fast path for synchronous calls); its future completes by itself through the process's
:class:`~pycoll.engine.progress_thread.ProgressThread` while the caller computes, which is what DDP's
reducer needs (it waits on the future in C++).
"""

from __future__ import annotations

import datetime
import functools
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from pycoll import Team
from pycoll.collectives import COLLECTIVES
from pycoll.engine.progress_thread import Watch, progress_thread
from pycoll.engine.request import Request
from pycoll.errors import PycollError, TimeoutError
from pycoll.ops import ReduceOp
from pycoll.torch.errors import InvalidArgumentError, torch_error
from pycoll.torch.tensors import Staged, Views, as_numpy, scatter_copies

#: The ProcessGroup method that serves each ``torch.distributed`` function of the table of
#: collectives (``Collective.torch``); list forms and coalesced forms are built on these.
TORCH_METHODS: Dict[str, str] = {
    "all_reduce": "allreduce", "broadcast": "broadcast", "reduce": "reduce",
    "all_gather_into_tensor": "_allgather_base", "reduce_scatter_tensor": "_reduce_scatter_base",
    "all_to_all_single": "alltoall_base", "gather": "gather", "scatter": "scatter", "barrier": "barrier",
}

_RED = dist.ReduceOp.RedOpType
#: torch's reduction operators and pycoll's.
OPS: Dict[Any, ReduceOp] = {
    _RED.SUM: ReduceOp.SUM, _RED.PRODUCT: ReduceOp.PROD, _RED.MIN: ReduceOp.MIN, _RED.MAX: ReduceOp.MAX,
    _RED.AVG: ReduceOp.AVG, _RED.BAND: ReduceOp.BAND, _RED.BOR: ReduceOp.BOR, _RED.BXOR: ReduceOp.BXOR,
}


def reduce_op(op: Any) -> ReduceOp:
    """pycoll's operator for a torch ``ReduceOp``: PREMUL_SUM (NCCL's, made by
    ``dist._make_nccl_premul_sum(factor)``) is a SUM of inputs the caller scales first (see
    :func:`premul_factor`)."""
    kind = getattr(op, "op", op)
    if kind == _RED.PREMUL_SUM:
        return ReduceOp.SUM
    try:
        return OPS[kind]
    except KeyError:
        raise ValueError(f"pycoll backend: reduction {kind} is not supported "
                         f"(supported: {', '.join(k.name for k in OPS)})") from None


def premul_factor(op: Any) -> Any:
    """The factor (a number or a one-element tensor) each input of a PREMUL_SUM is multiplied
    by before the sum, as NCCL does; None for every other op."""
    if getattr(op, "op", op) != _RED.PREMUL_SUM:
        return None
    factor = getattr(op, "factor", None)
    if factor is None:
        raise ValueError("pycoll backend: a PREMUL_SUM without its factor (make it with "
                         "torch.distributed._make_nccl_premul_sum(factor))")
    return factor


def scaled(x: torch.Tensor, factor: Any, in_place: bool) -> torch.Tensor:
    """``x`` times a PREMUL_SUM's ``factor`` (``x`` itself when factor is None): in place for a
    tensor the collective overwrites anyway, else a new one (an input the caller keeps)."""
    if factor is None:
        return x
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1:
            raise ValueError(f"PREMUL_SUM: the factor must be one number, got a tensor of shape "
                             f"{tuple(factor.shape)}")
        factor = factor.reshape(())  # (a 0-dim input is scaled in place too)
    if torch.result_type(x, factor) != x.dtype:
        raise ValueError(f"PREMUL_SUM of {x.dtype}: the factor {factor} would change the type "
                         "(give a factor of the tensor's kind)")
    with torch.no_grad():  # (a parameter is scaled as it is reduced: in place, outside autograd)
        return x.mul_(factor) if in_place else x * factor


#: What torch's SUM and PRODUCT of bool tensors compute (as gloo does): logical OR and AND.
_LOGICAL = {ReduceOp.SUM: ReduceOp.LOR, ReduceOp.PROD: ReduceOp.LAND}


def op_for(arr: np.ndarray, op: ReduceOp) -> ReduceOp:
    """``op`` as it applies to ``arr``'s elements: on bool, SUM is OR and PRODUCT is AND (gloo's
    meaning; pycoll itself refuses arithmetic on bool)."""
    return _LOGICAL.get(op, op) if arr.dtype == np.bool_ else op


class PycollWork(dist.Work):
    """The handle torch gets for one call: pycoll requests, what to do once they finished
    (copy outputs back), and the future DDP and ``async_op`` users wait on."""

    def __init__(self, pg: ProcessGroupPycoll, requests: Sequence[Request], result: List[torch.Tensor],
                 finish: Optional[Callable[[], None]] = None, timeout: Optional[float] = None,
                 source: Optional[Callable[[], int]] = None, background: bool = True) -> None:
        super().__init__()
        self._pg = pg
        # (one list of outputs is the value itself, as gloo and NCCL give it: ``all_gather``'s
        # future holds the gathered tensors, not a list around them)
        self._result = result[0] if len(result) == 1 and isinstance(result[0], list) else result
        #: Local work when the collectives finished (copies out); a coalesced call takes it over.
        self.on_finish = finish
        self._timeout = timeout
        self._source = source
        # Completed with the outputs, or with None on an error: what get_future() hands out is
        # chained to it and raises there. (A future completed by Python's set_exception holds the
        # exception as its *value*: DDP's C++ reducer reads it as tensors and crashed, SIGSEGV,
        # when a peer died. An exception raised in a then() callback is a C++ error it handles.)
        self._future: torch.futures.Future = torch.futures.Future()
        self._handed: Optional[torch.futures.Future] = None
        self._error: Optional[BaseException] = None
        # A synchronous call (torch waits at once) is not handed to the progress thread: waking it
        # would cost the caller a GIL hand-over per call. get_future() hands it over after all.
        self.watch: Watch = pg.progress.watch(requests, self._complete, background)

    def _complete(self, error: Optional[BaseException]) -> None:
        if error is None and self.on_finish is not None:
            try:
                self.on_finish()
            except BaseException as exc:  # noqa: BLE001 - reported through the future
                error = exc
        if error is not None:
            error = torch_error(error)  # (a DistBackendError, as torch's backends raise)
        self._error = error
        self._future.set_result(self._result if error is None else None)

    def _outcome(self, fut: torch.futures.Future) -> List[torch.Tensor]:
        if self._error is not None:
            raise self._error
        return fut.value()

    # -- torch's Work interface
    def wait(self, timeout: Any = None) -> bool:
        """Block until the call finished (driving the engine here); re-raise its error. A
        ``timeout`` of ``timedelta(0)`` or None means the group's timeout."""
        seconds = _seconds(timeout) or self._timeout
        try:
            self._pg.progress.wait(self.watch, seconds)
        except PycollError as exc:
            raise torch_error(exc) from None
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        self._pg.progress.drive(self.watch)
        if self._handed is None:
            self._handed = self._future.then(self._outcome)
        return self._handed

    def is_completed(self) -> bool:
        if not self.watch.called:
            self._pg.progress.drive(self.watch)
        # (the future is set inside the watch's callback, before the watch counts it as returned:
        # a caller that saw the future done must see the work completed too)
        return self.watch.called or self._future.done()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        if self._source is None:
            raise RuntimeError("source_rank() is only defined for recv from any source")
        self.wait()
        return self._source()

    _source_rank = source_rank

    def synchronize(self) -> None:
        self.wait()


def _seconds(timeout: Any) -> Optional[float]:
    """Seconds of a torch timeout (timedelta or ms); None for none/unset/zero."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout) / 1000.0
    return s if s > 0 else None


def rejecting(method: Callable[..., PycollWork]) -> Callable[..., PycollWork]:
    """A collective of the group whose argument errors (``ValueError`` raised before anything is
    sent) reach torch as gloo's do: an :class:`InvalidArgumentError`, a ``ValueError`` that is a
    ``RuntimeError`` too. (Only this rank raises, as with gloo: torch checks some arguments in its
    own Python layer first, where a backend cannot take part, so a rank that rejected a call
    cannot tell its peers by posting a rejection, as :class:`pycoll.mpi.Comm` does.)"""

    @functools.wraps(method)
    def checked(self: ProcessGroupPycoll, *args: Any, **kwargs: Any) -> PycollWork:
        try:
            return method(self, *args, **kwargs)
        except ValueError as exc:  # (pycoll's BufferError and ConfigError too: argument checks)
            if isinstance(exc, InvalidArgumentError):
                raise  # (a call inside this one said so already)
            raise InvalidArgumentError(str(exc)) from exc
    return checked


class ProcessGroupPycoll(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on a pycoll team."""

    def __init__(self, team: Team, timeout: Optional[float] = None, group_name: str = "") -> None:
        super().__init__(team.rank, team.size)
        self.team = team
        self.ctx = team.ctx
        self.timeout = timeout
        #: The process's progress thread, which completes works in the background.
        self.progress = progress_thread(self.ctx)
        self._group_name = group_name
        self._group_desc = ""
        self._coalescing: Optional[List[PycollWork]] = None
        self._closed = False
        #: Views of the tensors of repeated allreduces and broadcasts (see :class:`Views`).
        self.views = Views()
        #: With summation servers (``pycoll run --servers K``): the workers' MPI team whose
        #: push_pull uses them (None: push_pull uses this group's colocated services only).
        self.ps_team: Optional[Team] = None

    # ------------------------------------------------------------------ identity
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "pycoll"

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def __repr__(self) -> str:
        return f"<ProcessGroupPycoll rank {self.team.rank}/{self.team.size} over {self.team.transport.name}>"

    # ------------------------------------------------------------------ plumbing
    def _timeout(self, opts: Any) -> Optional[float]:
        return _seconds(getattr(opts, "timeout", None)) or self.timeout

    def _work(self, requests: Sequence[Request], result: List[torch.Tensor],
              finish: Optional[Callable[[], None]] = None, timeout: Optional[float] = None,
              source: Optional[Callable[[], int]] = None, opts: Any = None) -> PycollWork:
        background = getattr(opts, "asyncOp", True) and self._coalescing is None
        work = PycollWork(self, requests, result, finish, timeout or self.timeout, source, background)
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    def _start(self, coll: str, *args: Any, **kwargs: Any) -> Request:
        """Start pycoll collective ``coll`` (a row of :mod:`pycoll.collectives`) with the team
        method's arguments (the team posts under the engine's lock: the progress thread may be
        running)."""
        if self._closed:
            raise PycollError("pycoll backend: the process group was shut down")
        try:
            return getattr(self.team, COLLECTIVES[coll].name)(*args, **kwargs)
        except PycollError as exc:  # (one refused before anything was sent: a team out of step)
            raise torch_error(exc) from None

    def _post(self, start: Callable[[], Request]) -> Request:
        """Post one pycoll call (the team posts under the engine's lock: the progress thread may be
        running)."""
        if self._closed:
            raise PycollError("pycoll backend: the process group was shut down")
        try:
            return start()
        except PycollError as exc:
            raise torch_error(exc) from None

    @staticmethod
    def _finisher(staged: Sequence[Staged], after: Optional[Callable[[], None]] = None) -> Callable[[], None]:
        copies = [s for s in staged if s.copied]

        def finish() -> None:
            for s in copies:
                s.finish()
            if after is not None:
                after()
        return finish

    # ------------------------------------------------------------------ reductions
    @rejecting
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> PycollWork:
        torch_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        op, factor = reduce_op(torch_op), premul_factor(torch_op)
        t = self._timeout(opts)
        if any(x.layout is torch.sparse_coo for x in tensors):
            return self._sparse_allreduce(tensors, op, t, opts)
        for x in tensors:
            scaled(x, factor, in_place=True)  # (the result overwrites it)
        staged = [Staged(x, views=self.views) for x in tensors]
        reqs = [self._start("allreduce", s.arr, None, op_for(s.arr, op), timeout=t) for s in staged]
        return self._work(reqs, tensors, self._finisher(staged), t, opts=opts)

    def _sparse_allreduce(self, tensors: List[torch.Tensor], op: ReduceOp, timeout: Optional[float],
                          opts: Any) -> PycollWork:
        """The SUM of sparse COO tensors, as gloo computes it: every rank's indices and values
        gathered (an allgather of the counts, then two allgathervs), added up and coalesced into
        each tensor in place. Runs before it returns (the work is done)."""
        if op is not ReduceOp.SUM:
            raise ValueError(f"pycoll backend: sparse tensors reduce with SUM only (as gloo), not {op.name}")
        team = self.team
        for x in tensors:
            mine = x.coalesce()
            idx = mine.indices().t().contiguous()  # (nnz, sparse dims)
            val = mine.values().contiguous()  # (nnz, *dense shape)
            dims, per = idx.shape[1], max(1, math.prod(val.shape[1:]))
            counts = np.zeros(team.size, np.int64)
            team.allgather(np.array([idx.shape[0]], np.int64), counts, timeout=timeout).wait()
            every_idx = torch.empty((int(counts.sum()), dims), dtype=torch.int64)
            every_val = torch.empty((int(counts.sum()), *val.shape[1:]), dtype=val.dtype)
            team.allgatherv(as_numpy(idx), as_numpy(every_idx), [int(c) * dims for c in counts],
                            timeout=timeout).wait()
            team.allgatherv(as_numpy(val), as_numpy(every_val), [int(c) * per for c in counts],
                            timeout=timeout).wait()
            with torch.no_grad():
                x.copy_(torch.sparse_coo_tensor(every_idx.t(), every_val, x.shape).coalesce())
        return self._work([], tensors, None, timeout, opts=opts)

    def allreduce_scheduled(self, tensor: torch.Tensor, priority: int = 0, op: Any = dist.ReduceOp.SUM,
                            tag: Any = None) -> PycollWork:
        """An allreduce with an engine priority (lower starts first), partitioned and held back by
        credit as the engine's settings say: what :func:`pycoll.torch.priority_hook` posts."""
        rop = reduce_op(op)
        s = Staged(scaled(tensor, premul_factor(op), in_place=True))
        req = self._start("allreduce", s.arr, None, rop, priority=priority, tag=tag,
                                                     timeout=self.timeout)
        return self._work([req], [tensor], self._finisher([s]), self.timeout)

    def push_pull(self, tensor: torch.Tensor, name: str, average: bool = False, priority: int = 0,
                  mode: str = "sync") -> PycollWork:
        """BytePS push-sum-pull of ``tensor`` in place (:meth:`pycoll.Team.push_pull`): summed (or
        averaged) by the summation services; ``mode="async"`` adds it as a delta and returns the
        latest values."""
        s = Staged(tensor)
        team = self.ps_team if self.ps_team is not None else self.team
        req = self._post(lambda: team.push_pull(s.arr, name=name, priority=priority, average=average,
                                                mode=mode, timeout=self.timeout))
        return self._work([req], [tensor], self._finisher([s]), self.timeout)

    @rejecting
    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> PycollWork:
        return self.allreduce(tensors, opts)

    @rejecting
    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> PycollWork:
        op, factor = reduce_op(opts.reduceOp), premul_factor(opts.reduceOp)
        root = opts.rootRank
        t = self._timeout(opts)
        at_root = self.team.rank == root
        staged = [Staged(scaled(x, factor, in_place=at_root), output=at_root) for x in tensors]
        reqs = [self._start("reduce", s.arr, None, op_for(s.arr, op), root, timeout=t) for s in staged]
        return self._work(reqs, tensors, self._finisher(staged), t, opts=opts)

    @rejecting
    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                       opts: Any) -> PycollWork:
        op, factor = reduce_op(opts.reduceOp), premul_factor(opts.reduceOp)
        t = self._timeout(opts)
        reqs, staged = [], []
        for out, ins in zip(output_tensors, input_tensors):
            self._check_list(ins, out, "reduce_scatter")
            flat = scaled(torch.cat([x.reshape(-1) for x in ins]), factor, in_place=True)
            s = Staged(out)
            staged.append(s)
            reqs.append(self._start("reduce_scatter", as_numpy(flat), s.arr, op_for(s.arr, op), timeout=t))
        return self._work(reqs, output_tensors, self._finisher(staged), t, opts=opts)

    @rejecting
    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> PycollWork:  # noqa: A002
        op, factor = reduce_op(opts.reduceOp), premul_factor(opts.reduceOp)
        t = self._timeout(opts)
        if input.numel() != output.numel() * self.team.size:
            raise ValueError(f"reduce_scatter_tensor: input of {input.numel()} elements must be "
                             f"{self.team.size} x the output's {output.numel()}")
        s, src = Staged(output), Staged(scaled(input, factor, in_place=False), output=False)
        req = self._start("reduce_scatter", src.arr, s.arr, op_for(s.arr, op), timeout=t)
        return self._work([req], [output], self._finisher([s]), t, opts=opts)

    reduce_scatter_tensor = reduce_scatter_single = _reduce_scatter_base

    @rejecting
    def reduce_scatter_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                        opts: Any) -> PycollWork:
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._merge(works, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # ------------------------------------------------------------------ data movement
    @rejecting
    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> PycollWork:
        root = opts.rootRank
        t = self._timeout(opts)
        staged = [Staged(x, views=self.views) for x in tensors]
        reqs = [self._start("bcast", s.arr, root, timeout=t) for s in staged]
        return self._work(reqs, tensors, self._finisher(staged), t, opts=opts)

    @rejecting
    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
                  opts: Any = None) -> PycollWork:
        t = self._timeout(opts)
        reqs, copies = [], []
        for outs, x in zip(output_tensors, input_tensors):
            self._check_list(outs, x, "all_gather")
            src = Staged(x, output=False)
            flat = torch.empty(x.numel() * self.team.size, dtype=x.dtype)
            reqs.append(self._start("allgather", src.arr, as_numpy(flat), timeout=t))
            copies.append((flat, outs))
        return self._work(reqs, output_tensors, lambda: scatter_copies(copies), t, opts=opts)

    @rejecting
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> PycollWork:  # noqa: A002
        t = self._timeout(opts)
        if output.numel() != input.numel() * self.team.size:
            raise ValueError(f"all_gather_into_tensor: output of {output.numel()} elements must be "
                             f"{self.team.size} x the input's {input.numel()}")
        s, src = Staged(output), Staged(input, output=False)
        req = self._start("allgather", src.arr, s.arr, timeout=t)
        return self._work([req], [output], self._finisher([s]), t, opts=opts)

    allgather_into_tensor = all_gather_single = _allgather_base

    @rejecting
    def allgather_into_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                        opts: Any = None) -> PycollWork:
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._merge(works, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    @rejecting
    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], input_list: List[torch.Tensor],
                            opts: Any = None) -> PycollWork:
        """gloo's ``all_gather_coalesced``: ``output_lists[r][j]`` gets rank r's ``input_list[j]``
        (one list per rank, each as long as ``input_list``; the inputs may differ in shape)."""
        n = self.team.size
        if len(output_lists) != n or any(len(outs) != len(input_list) for outs in output_lists):
            raise ValueError(f"all_gather_coalesced: need {n} output lists (one per rank) of "
                             f"{len(input_list)} tensors each, got "
                             f"{[len(outs) for outs in output_lists]}")
        works = [self.allgather([[output_lists[r][j] for r in range(n)]], [x], opts)
                 for j, x in enumerate(input_list)]
        return self._merge(works, output_lists)

    @rejecting
    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
               opts: Any) -> PycollWork:
        root = opts.rootRank
        t = self._timeout(opts)
        x = input_tensors[0]
        src = Staged(x, output=False)
        if self.team.rank != root:
            req = self._start("gather", src.arr, None, root, timeout=t)
            return self._work([req], [], None, t, opts=opts)
        outs = output_tensors[0]
        self._check_list(outs, x, "gather")
        flat = torch.empty(x.numel() * self.team.size, dtype=x.dtype)
        req = self._start("gather", src.arr, as_numpy(flat), root, timeout=t)
        return self._work([req], output_tensors, lambda: scatter_copies([(flat, outs)]), t, opts=opts)

    @rejecting
    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                opts: Any) -> PycollWork:
        root = opts.rootRank
        t = self._timeout(opts)
        out = Staged(output_tensors[0])
        if self.team.rank != root:
            req = self._start("scatter", None, out.arr, root, timeout=t)
        else:
            ins = input_tensors[0]
            self._check_list(ins, output_tensors[0], "scatter")
            flat = as_numpy(torch.cat([i.reshape(-1) for i in ins]))
            req = self._start("scatter", flat, out.arr, root, timeout=t)
        return self._work([req], output_tensors, self._finisher([out]), t, opts=opts)

    @rejecting
    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> PycollWork:
        t = self._timeout(opts)
        n = self.team.size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"all_to_all: need {n} input and {n} output tensors, got {len(input_tensors)} "
                             f"and {len(output_tensors)}")
        dtype = input_tensors[0].dtype
        if any(x.dtype != dtype for x in [*input_tensors, *output_tensors]):
            raise ValueError("all_to_all: every tensor must have the same dtype")
        send = as_numpy(torch.cat([x.reshape(-1) for x in input_tensors]))
        recv = torch.empty(sum(o.numel() for o in output_tensors), dtype=dtype)
        scounts = [x.numel() for x in input_tensors]
        rcounts = [o.numel() for o in output_tensors]
        req = self._start("alltoallv", send, as_numpy(recv), scounts, rcounts, timeout=t)
        copies = [(recv, output_tensors)]
        return self._work([req], output_tensors, lambda: scatter_copies(copies), t, opts=opts)

    @rejecting
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int],  # noqa: A002
                      input_split_sizes: List[int], opts: Any = None) -> PycollWork:
        t = self._timeout(opts)
        n = self.team.size
        s, src = Staged(output), Staged(input, output=False)
        if not output_split_sizes and not input_split_sizes:
            if input.numel() != output.numel() or input.numel() % n:
                raise ValueError(f"all_to_all_single: input ({input.numel()}) and output ({output.numel()}) "
                                 f"must be equal and divide into {n} blocks")
            req = self._start("alltoall", src.arr, s.arr, timeout=t)
        else:
            scounts = _split_counts(input, input_split_sizes, n, "input")
            rcounts = _split_counts(output, output_split_sizes, n, "output")
            req = self._start("alltoallv", src.arr, s.arr, scounts, rcounts, timeout=t)
        return self._work([req], [output], self._finisher([s]), t, opts=opts)

    all_to_all_single = alltoall_base

    @rejecting
    def barrier(self, opts: Any = None) -> PycollWork:
        t = self._timeout(opts)
        req = self._start("barrier", timeout=t)
        return self._work([req], [], None, t, opts=opts)

    # ------------------------------------------------------------------ point to point
    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> PycollWork:
        x = Staged(tensors[0], output=False)
        req = self._post(lambda: self.team.isend(x.arr, dst, tag=("torch", tag), timeout=self.timeout))
        return self._work([req], tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> PycollWork:
        x = Staged(tensors[0])
        req = self._post(lambda: self.team.irecv(x.arr, src, tag=("torch", tag), timeout=self.timeout))
        return self._work([req], tensors, self._finisher([x]), source=lambda: src)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> PycollWork:
        x = Staged(tensors[0])
        req = self._post(lambda: self.team.irecv(x.arr, None, tag=("torch", tag), timeout=self.timeout))
        return self._work([req], tensors, self._finisher([x]), source=lambda: req.task.source)

    # ------------------------------------------------------------------ coalescing, shutdown
    def _start_coalescing(self, device: Any = None) -> None:
        if self._coalescing is not None:
            raise RuntimeError("pycoll backend: coalescing already started")
        self._coalescing = []

    start_coalescing = _start_coalescing

    def _end_coalescing(self, device: Any = None) -> PycollWork:
        works, self._coalescing = self._coalescing, None
        if works is None:
            raise RuntimeError("pycoll backend: end of coalescing without a start")
        return self._merge(works, [])

    end_coalescing = _end_coalescing

    def _merge(self, works: List[PycollWork], result: List[Any]) -> PycollWork:
        """One work for several (a coalesced call): done when all are; it copies their outputs."""
        reqs = [r for w in works for r in w.watch.requests]
        finishes = [w.on_finish for w in works if w.on_finish is not None]
        for w in works:
            w.on_finish = None

        def finish() -> None:
            for f in finishes:
                f()
        merged = PycollWork(self, reqs, result, finish, self.timeout,
                            background=all(w.watch.background for w in works))
        if self._coalescing is not None:  # recorded once, as the merged work
            self._coalescing[:] = [w for w in self._coalescing if w not in works]
            self._coalescing.append(merged)
        return merged

    def shutdown(self) -> None:
        """Release the team (sockets, shared segment). Collectives after this raise."""
        if not self._closed:
            self._closed = True
            with self.ctx.lock:
                self.team.close()
            if self.ps_team is not None:
                ps_team, self.ps_team = self.ps_team, None
                ps_team.close()  # the servers exit once every worker closed

    abort = shutdown

    # ------------------------------------------------------------------ checks
    def _check_list(self, tensors: Sequence[torch.Tensor], like: torch.Tensor, what: str) -> None:
        n = self.team.size
        if len(tensors) != n:
            raise ValueError(f"{what}: need a list of {n} tensors, got {len(tensors)}")
        for x in tensors:
            if x.numel() != like.numel() or x.dtype != like.dtype:
                raise ValueError(f"{what}: every tensor must be {like.numel()} x {like.dtype}, "
                                 f"got {x.numel()} x {x.dtype}")


def _split_counts(t: torch.Tensor, splits: Sequence[int], n: int, what: str) -> List[int]:
    """Element counts per rank of an ``all_to_all_single`` buffer split along dim 0."""
    rows = t.shape[0] if t.dim() else 1
    per_row = t.numel() // rows if rows else 0
    if not splits:
        if rows % n:
            raise ValueError(f"all_to_all_single: {what} of {rows} rows does not divide into {n} ranks")
        splits = [rows // n] * n
    if len(splits) != n or sum(splits) != rows:
        raise ValueError(f"all_to_all_single: {what} split sizes {list(splits)} must be {n} numbers adding "
                         f"up to its {rows} rows")
    return [int(s) * per_row for s in splits]


__all__ = ["OPS", "ProcessGroupPycoll", "PycollWork", "TimeoutError", "reduce_op"]
