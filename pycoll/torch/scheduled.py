"""PyTorch training without the global barrier: ByteScheduler's ScheduledOptimizer, BytePS's CrossBarrier.

With DDP, ``optimizer.step()`` waits for every gradient of the step (the global barrier), then
updates every parameter, and only then may the next forward pass start. :class:`ScheduledOptimizer`
removes that barrier::

    opt = pycoll.torch.ScheduledOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    for x, y in data:
        loss_fn(model(x), y).backward()   # each gradient is posted from its hook as it is produced
        opt.step()                        # a step boundary only: returns at once
    opt.synchronize()                     # every update done (before eval, checkpoints)

* **Per-parameter updates.** The optimizer is split into one optimizer per parameter (same class,
  the hyper-parameters of that parameter's group: torch's "optimizer step in backward" pattern), so
  any element-wise torch optimizer works (SGD, Adam(W), RMSprop, Adagrad, ...; not LBFGS, nor
  anything that needs every gradient at once such as global gradient-norm clipping).
* **Gradients are scheduled as they appear.** A ``register_post_accumulate_grad_hook`` takes the
  gradient away from ``p.grad`` and submits it to a :class:`pycoll.scheduling.Scheduler` (SUM,
  named by the parameter's name, priority = its layer's index from the input: the layer the next
  forward needs first is the most urgent), partitioned and held back by credit.
* **Updates run as soon as their gradient is reduced**, on the context's progress thread: divide
  by the world size (DDP averages), step that parameter's optimizer, free the gradient, signal the
  parameter as updated.
* **The next forward waits per layer** (the CrossBarrier): a forward pre-hook on every module that
  directly owns parameters waits for those parameters' updates only, so layer 0 computes while
  later layers' gradients are still in flight (parameters whose layer's forward never ran, e.g.
  used by a parent's forward, are waited for before the whole forward pass).
  :meth:`ScheduledOptimizer.step` waits for no communication of its step (at most, and in practice
  never, for control messages of earlier steps still in flight).

Unused parameters (no gradient on this rank in a step) are handled like DDP's
``find_unused_parameters=True``: at :meth:`~ScheduledOptimizer.step` this rank contributes zeros
for them, and every step one small "used" vector (a count per parameter) is summed across ranks
with them; a parameter no rank used is not updated that step (its gradient stays None, as torch
optimizers skip it), one that some rank used is updated with the average as DDP would.

Limits: one backward pass per step (no gradient accumulation), dense CPU gradients, no closure;
BatchNorm buffers are broadcast once, at construction; the scheduler's credit is the process's
engine-wide budget.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from pycoll import config, trace
from pycoll.errors import PycollError, TimeoutError
from pycoll.scheduling import ScheduledTensor, Scheduler
from pycoll.torch.backend import ProcessGroupPycoll
from pycoll.torch.hooks import default_group
from pycoll.torch.tensors import as_numpy

#: Prefix of the scheduler names of the optimizer's own control tensors (no parameter name has it).
_CONTROL = "~scheduled-optimizer"


class UpdateError(PycollError):
    """A parameter's update failed (its reduction or its optimizer step); raised in the main thread
    at the next forward, :meth:`ScheduledOptimizer.step` or :meth:`ScheduledOptimizer.synchronize`."""


class _Join:
    """Runs ``fn(error)`` once ``n`` arrivals happened (the first error, or None)."""

    __slots__ = ("n", "fn", "error", "lock")

    def __init__(self, n: int, fn: Callable[[Optional[BaseException]], None]) -> None:
        self.n, self.fn, self.error, self.lock = n, fn, None, threading.Lock()

    def arrive(self, error: Optional[BaseException] = None) -> None:
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.n -= 1
            last = self.n == 0
        if last:
            self.fn(self.error)


class _Param:
    """One trainable parameter: its name, priority, optimizer, and its update of the last step."""

    __slots__ = ("name", "param", "index", "priority", "optimizer", "done", "step", "grad", "covered",
                 "updates", "t_ready")

    def __init__(self, name: str, param: torch.nn.Parameter, index: int,
                 optimizer: torch.optim.Optimizer) -> None:
        self.name = name
        self.param = param
        self.index = index
        self.priority = index
        self.optimizer = optimizer
        self.done = threading.Event()  # set: no update outstanding (the next forward may use it)
        self.done.set()
        self.step = -1  # the step whose gradient was last submitted
        self.grad: Optional[torch.Tensor] = None  # the gradient being reduced
        self.covered = False  # its module's forward pre-hook has run at least once
        self.updates = 0  # optimizer steps applied
        self.t_ready = 0.0  # when the gradient was submitted


class ScheduledOptimizer:
    """Data-parallel training with per-parameter scheduled updates and no global barrier.

    Args:
        model: the module to train (CPU tensors). Its parameters and buffers are broadcast from
            rank 0 at construction, as DDP does (buffers only then: BatchNorm statistics stay
            per rank afterwards, like DDP's ``broadcast_buffers=False``).
        optimizer: any torch optimizer over (a subset of) ``model``'s parameters; it is split into
            one optimizer per parameter and is not used afterwards. State it already holds (it
            was stepped) is carried over to the per-parameter optimizers.
        process_group: a ``pycoll`` process group (default: the default group).
        partition_bytes, credit_bytes, tuning: the :class:`pycoll.scheduling.Scheduler`'s settings
            (credit is the process's engine-wide budget).
        priorities: ``{parameter name: int}`` overriding the priority of some parameters (lower
            is more urgent). By default a parameter's priority is the index, counted from the
            input, of its layer (module owning it directly) in the order of the first forward pass.

    One backward pass per :meth:`step` (no gradient accumulation across backward passes); dense
    gradients only. Gradients are freed after each update: ``p.grad`` is None between steps.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, process_group: Any = None,
                 partition_bytes: Any = None, credit_bytes: Any = None, tuning: Any = None,
                 priorities: Optional[Dict[str, int]] = None) -> None:
        pg = process_group if process_group is not None else default_group()
        if not isinstance(pg, ProcessGroupPycoll):
            raise TypeError(f"ScheduledOptimizer needs a process group of backend 'pycoll', got {pg!r}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"ScheduledOptimizer needs a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if isinstance(optimizer, torch.optim.LBFGS):
            raise TypeError("ScheduledOptimizer: LBFGS needs every gradient at once (and a closure); "
                            "it cannot be split into per-parameter updates")
        self.model = model
        self.process_group = pg
        self.world_size = pg.team.size
        self._params: List[_Param] = []
        #: The per-parameter optimizers, by parameter name.
        self.optimizers: Dict[str, torch.optim.Optimizer] = {}
        self._split(model, optimizer)
        self._by_name = {st.name: st for st in self._params}
        self._overrides = dict(priorities or {})
        unknown = sorted(set(self._overrides) - set(self._by_name))
        if unknown:
            raise ValueError(f"ScheduledOptimizer: priorities name parameters it does not train: {unknown}")
        self._broadcast_state(model, pg)
        self.scheduler = Scheduler(pg.team, partition_bytes=partition_bytes, credit_bytes=credit_bytes,
                                   tuning=tuning, background=True)
        t = self.scheduler.timeout
        if t is None:
            t = config.get("PYCOLL_TIMEOUT")
        #: Seconds a forward pass or :meth:`synchronize` waits for an update (None: forever).
        self.timeout: Optional[float] = None if t is None or math.isinf(t) else float(t)
        self._errors: List[BaseException] = []
        self._step = 0
        # the "used" vectors of even and odd steps (two names, so that step() never waits for the
        # previous step's: each name stays bounded in the team's tag table)
        self._used: List[threading.Event] = [threading.Event(), threading.Event()]
        for ev in self._used:
            ev.set()
        self._t_bwd: Optional[Tuple[float, float]] = None  # first and last gradient hook of the step
        self._t_fwd = 0.0
        self._recording = True  # the first forward pass records the layers' order
        self._order: List[List[_Param]] = []
        self._seen: set = set()
        self._tracer = trace.tracer()
        self._handles: List[Any] = []
        self._install_hooks(model)
        self._default_priorities()
        self._closed = False

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _broadcast_state(model: torch.nn.Module, pg: ProcessGroupPycoll) -> None:
        """Start every replica from rank 0's parameters and buffers (what DDP does)."""
        tensors = [p.detach() for p in model.parameters()] + [b for b in model.buffers()]
        works = [dist.broadcast(t, 0, group=pg, async_op=True) for t in tensors if t.numel()]
        for w in works:
            w.wait()

    def _split(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """One optimizer per trainable parameter, with its group's hyper-parameters and its state."""
        names = {id(p): n for n, p in model.named_parameters()}
        group_of: Dict[int, dict] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in names:
                    raise ValueError("ScheduledOptimizer: the optimizer holds a parameter that is not one "
                                     "of the model's")
                group_of[id(p)] = group
        for name, p in model.named_parameters():
            group = group_of.get(id(p))
            if group is None or not p.requires_grad:
                continue  # not trained by this optimizer: no hook, no update
            if p.is_sparse:
                raise TypeError(f"ScheduledOptimizer: parameter {name!r} is sparse (dense only)")
            hyper = {k: v for k, v in group.items() if k != "params"}
            try:
                opt = type(optimizer)([{**hyper, "params": [p]}])
            except TypeError:  # a class whose constructor requires arguments beyond the group's
                opt = type(optimizer)([{**hyper, "params": [p]}], **optimizer.defaults)
            state = optimizer.state.get(p)
            if state:  # carried over: the split optimizer goes on where the given one stopped
                opt.state[p] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in state.items()}
            self.optimizers[name] = opt
            self._params.append(_Param(name, p, len(self._params), opt))
        if not self._params:
            raise ValueError("ScheduledOptimizer: the optimizer trains none of the model's parameters")

    def _install_hooks(self, model: torch.nn.Module) -> None:
        by_id = {id(st.param): st for st in self._params}
        self._handles.append(model.register_forward_pre_hook(self._root_pre))
        for module in model.modules():
            own = [by_id[id(p)] for _, p in module.named_parameters(recurse=False) if id(p) in by_id]
            if own:
                self._handles.append(module.register_forward_pre_hook(self._layer_pre(own)))
        self._handles.append(model.register_forward_hook(self._root_post))
        for st in self._params:
            self._handles.append(st.param.register_post_accumulate_grad_hook(self._grad_hook(st)))

    def _default_priorities(self) -> None:
        """Layers in ``model.modules()`` order until the first forward pass says better."""
        layer: Dict[int, int] = {}
        n = 0
        for module in self.model.modules():
            own = [p for _, p in module.named_parameters(recurse=False)]
            if own:
                for p in own:
                    layer.setdefault(id(p), n)
                n += 1
        self._layer = {st.index: layer[id(st.param)] for st in self._params}
        for st in self._params:
            st.priority = self._layer[st.index]
        self._apply_overrides()

    def _apply_overrides(self) -> None:
        for name, prio in self._overrides.items():
            self._by_name[name].priority = int(prio)

    def _forward_priorities(self) -> None:
        """Priority = index of the first forward pass's layer that used the parameter first."""
        prio: Dict[int, int] = {}
        for i, own in enumerate(self._order):
            for st in own:
                prio.setdefault(st.index, i)
        # layers the first forward did not use: after the others, in model.modules() order
        rest = sorted({self._layer[st.index] for st in self._params if st.index not in prio})
        after = {layer: len(self._order) + j for j, layer in enumerate(rest)}
        for st in self._params:
            prio.setdefault(st.index, after.get(self._layer[st.index], 0))
        for st in self._params:
            st.priority = prio[st.index]
        self._apply_overrides()

    # ------------------------------------------------------------------ forward
    def _root_pre(self, module: torch.nn.Module, args: Any) -> None:
        self._t_fwd = time.monotonic()
        self._raise_errors()
        # parameters whose layer's pre-hook never ran (used in a parent's forward, or not used yet)
        # are waited for before the whole forward pass
        self._wait([st for st in self._params if not st.covered])

    def _root_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._recording:
            self._recording = False
            self._forward_priorities()
        tracer = self._tracer
        if tracer is not None:
            tracer.complete("forward", "forward", self._t_fwd, time.monotonic(), step=self._step)

    def _layer_pre(self, own: List[_Param]) -> Callable[[torch.nn.Module, Any], None]:
        def pre(module: torch.nn.Module, args: Any) -> None:
            if self._recording and id(module) not in self._seen:
                self._seen.add(id(module))
                self._order.append(own)
            for st in own:
                st.covered = True
            self._wait(own)
        return pre

    def _wait(self, params: Sequence[_Param], timeout: Optional[float] = None,
              raise_errors: bool = True) -> None:
        """Block until ``params``' updates are done; re-raise a stored update error (unless
        ``raise_errors`` is False: in backward and before step()'s collectives, where raising on
        one rank only would leave the others waiting for its messages)."""
        t = self.timeout if timeout is None else timeout
        for st in params:
            if not st.done.is_set() and not st.done.wait(t):
                raise TimeoutError(f"ScheduledOptimizer: the update of {st.name!r} (step {st.step}) did not "
                                   f"finish within {t:g} s")
        if raise_errors:
            self._raise_errors()

    def _raise_errors(self) -> None:
        if self._errors:
            error = self._errors[0]
            self._errors.clear()
            raise error

    # ------------------------------------------------------------------ backward
    def _grad_hook(self, st: _Param) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            now = time.monotonic()
            self._t_bwd = (now, now) if self._t_bwd is None else (self._t_bwd[0], now)
            if st.step == self._step:
                raise UpdateError(f"ScheduledOptimizer: parameter {st.name!r} got a second gradient before "
                                  "step(): one backward pass per step (no gradient accumulation)")
            grad = p.grad
            p.grad = None  # ours while in flight: a user's zero_grad() cannot touch it
            if grad is None:
                return
            if grad.is_sparse:
                raise UpdateError(f"ScheduledOptimizer: parameter {st.name!r} got a sparse gradient")
            self._wait([st], raise_errors=False)  # normally done long ago: its layer's forward waited
            self._submit(st, grad.contiguous())
        return hook

    def _submit(self, st: _Param, grad: torch.Tensor,
                on_done: Optional[Callable[[ScheduledTensor, Optional[BaseException]], None]] = None) -> None:
        """Hand ``grad`` (``st``'s gradient of this step) to the scheduler; ``on_done`` default: update."""
        st.step = self._step
        st.grad = grad
        st.t_ready = time.monotonic()
        st.done.clear()
        if on_done is None:
            def on_done(entry: ScheduledTensor, error: Optional[BaseException]) -> None:
                self._update(st, error, True)
        try:
            self.scheduler.submit(st.name, as_numpy(grad), st.priority, on_done=on_done)
        except BaseException:
            st.grad = None
            st.done.set()
            raise

    # ------------------------------------------------------------------ updates (progress thread)
    def _update(self, st: _Param, error: Optional[BaseException], used: bool) -> None:
        """``st``'s reduced gradient is here: average it, step its optimizer, free it, signal."""
        t0 = time.monotonic()
        grad, st.grad = st.grad, None
        p = st.param
        try:
            if error is not None:
                raise error
            if used and grad is not None:
                with torch.no_grad():
                    grad.div_(self.world_size)
                    p.grad = grad
                    try:
                        st.optimizer.step()
                        st.updates += 1
                    finally:
                        p.grad = None
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            if not isinstance(exc, PycollError):
                wrapped = UpdateError(f"ScheduledOptimizer: the update of {st.name!r} failed: "
                                      f"{type(exc).__name__}: {exc}")
                wrapped.__cause__ = exc
                exc = wrapped
            self._errors.append(exc)
        finally:
            st.done.set()
        tracer = self._tracer
        if tracer is not None:
            try:
                tracer.complete(f"update {st.name}", "update", t0, time.monotonic(), name=st.name,
                                step=st.step, priority=st.priority, applied=used,
                                reduce_us=round((t0 - st.t_ready) * 1e6, 1))
            except Exception:  # noqa: BLE001 - tracing never breaks training
                pass

    # ------------------------------------------------------------------ the step boundary
    def step(self, closure: Optional[Callable[[], Any]] = None) -> None:
        """End the training step: contribute zeros for this rank's unused parameters, post the
        step's "used" vector, tell the scheduler (auto-tuning). Waits for no communication."""
        if closure is not None:
            raise ValueError("ScheduledOptimizer.step: closures are not supported")
        step = self._step
        counts = np.zeros(len(self._params), dtype=np.int32)
        unused = []
        for st in self._params:
            if st.step == step:
                counts[st.index] = 1
            else:
                unused.append(st)
        # normally no wait: the previous step's zeros of a parameter unused twice in a row, and the
        # used vector of two steps ago, arrived long since
        self._wait(unused, raise_errors=False)
        done = self._used[step % 2]
        if not done.wait(self.timeout):
            raise TimeoutError(f"ScheduledOptimizer: the used-parameter vector of step {step - 2} did not "
                               f"arrive within {self.timeout:g} s")
        done.clear()
        joins: List[_Join] = []
        for st in unused:
            join = _Join(2, lambda error, st=st: self._update(st, error, bool(counts[st.index])))
            joins.append(join)
            self._submit(st, torch.zeros_like(st.param, memory_format=torch.contiguous_format),
                         on_done=lambda entry, error, join=join: join.arrive(error))

        def used_done(entry: ScheduledTensor, error: Optional[BaseException]) -> None:
            try:
                for join in joins:
                    join.arrive(error)
            finally:
                done.set()
        try:
            self.scheduler.submit(f"{_CONTROL}/used{step % 2}", counts, immediate=True, on_done=used_done)
        except BaseException:
            done.set()
            raise
        tracer = self._tracer
        if tracer is not None and self._t_bwd is not None:
            tracer.complete("backward", "backward", self._t_bwd[0], self._t_bwd[1], step=step)
        self._t_bwd = None
        self._step += 1
        self.scheduler.step()
        self._tracer = trace.tracer()
        self._raise_errors()  # after this step's collectives are posted, so every rank posted them

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No-op: every gradient is taken from ``p.grad`` by its hook and freed after its update,
        so ``p.grad`` is already None at every step boundary."""

    def synchronize(self, timeout: Optional[float] = None) -> None:
        """Wait for every outstanding update (before evaluating or saving); re-raise a failed one.
        Raises :class:`pycoll.TimeoutError` after ``timeout`` seconds (default: the scheduler's)."""
        t = self.timeout if timeout is None else timeout
        deadline = None if t is None else time.monotonic() + t
        self._wait(self._params, t)
        for ev in self._used:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not ev.wait(left):
                raise TimeoutError(f"ScheduledOptimizer: the step's used-parameter vector did not arrive "
                                   f"within {t:g} s")
        self._raise_errors()

    # ------------------------------------------------------------------ state
    @property
    def step_count(self) -> int:
        """Steps ended so far."""
        return self._step

    @property
    def param_groups(self) -> List[dict]:
        """Every per-parameter optimizer's single group (change ``lr`` here: it applies to the
        updates that start after the change)."""
        return [opt.param_groups[0] for opt in self.optimizers.values()]

    def priority(self, name: str) -> int:
        """The scheduling priority of parameter ``name`` (lower: more urgent)."""
        return self._by_name[name].priority

    def updated(self, name: str) -> bool:
        """Whether parameter ``name`` has no update outstanding."""
        return self._by_name[name].done.is_set()

    def state_dict(self) -> Dict[str, Any]:
        """The per-parameter optimizers' states by parameter name (after :meth:`synchronize`)."""
        self.synchronize()
        return {"step": self._step, "optimizers": {n: o.state_dict() for n, o in self.optimizers.items()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned (after :meth:`synchronize`)."""
        self.synchronize()
        missing = sorted(set(self.optimizers) - set(state["optimizers"]))
        if missing:
            raise KeyError(f"ScheduledOptimizer.load_state_dict: no state for {missing}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][name])

    def close(self, wait: bool = True) -> None:
        """Remove every hook (after waiting for the outstanding updates unless ``wait=False``); the
        model then trains or evaluates as a plain module."""
        if self._closed:
            return
        try:
            if wait:
                self.synchronize()
        finally:
            self._closed = True
            for h in self._handles:
                h.remove()
            self._handles = []

    remove = close

    def __enter__(self) -> ScheduledOptimizer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(wait=exc[0] is None)

    def __repr__(self) -> str:
        opt = type(next(iter(self.optimizers.values()))).__name__
        return (f"<ScheduledOptimizer {opt} x {len(self._params)} parameters, step {self._step}, "
                f"{sum(not st.done.is_set() for st in self._params)} updates outstanding>")


__all__ = ["ScheduledOptimizer", "UpdateError"]
