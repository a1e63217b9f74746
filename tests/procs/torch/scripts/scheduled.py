"""Run by tests/procs/torch/test_torch_scheduled.py on every rank: pycoll.torch.ScheduledOptimizer
against DDP.

Modes:

* ``equal``: train the same models from the same seed for ``STEPS`` steps, each rank on its own
  data, once with DDP over a gloo group (and the plain optimizer) and once with a
  ScheduledOptimizer over the pycoll default group (small partitions and credit, tuning off), for
  SGD with momentum, AdamW (two parameter groups), RMSprop and Adagrad, an MLP and a CNN, and an
  MLP whose extra head some ranks (and on some steps every rank) leave unused, against DDP with
  ``find_unused_parameters``: the final parameters must agree within 1e-6 relative and be the same
  on every rank. Also: priorities from the first forward's layer order, optimizer state carried
  over, state_dict round trip, a failed update raised in the main thread, a gloo group refused.
* ``overlap``: rank 1 makes the last layer's gradient ready 0.4 s late on a few steps: ``step()``
  returns at once with that update outstanding, the next forward's layer 0 starts before the last
  layer's update finished and the last layer's forward starts only after it; the result still
  equals DDP's; under ``PYCOLL_TRACE`` the forward, backward and update spans are in the trace.
"""

import sys
import threading
import time
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - torch's usual name
from torch.nn.parallel import DistributedDataParallel as DDP

import pycoll
import pycoll.torch  # registers the "pycoll" backend
from pycoll.torch import ScheduledOptimizer
from tests.procs.torch.scripts.ddp import CNN, MLP, assert_same_on_every_rank, batch
from tests.rank import run_torch_rank

STEPS = 20
PARTITION_BYTES = 4096
CREDIT_BYTES = 8192


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """Optimizer ``name`` over ``model``'s parameters (AdamW: no weight decay nor the same lr for biases)."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    if name == "adamw":
        weights = [p for n, p in model.named_parameters() if not n.endswith("bias")]
        biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
        return torch.optim.AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0, "lr": 2e-3}],
                                 lr=1e-3, weight_decay=0.05)
    if name == "rmsprop":
        return torch.optim.RMSprop(model.parameters(), lr=1e-3, momentum=0.5)
    if name == "adagrad":
        return torch.optim.Adagrad(model.parameters(), lr=0.05)
    raise ValueError(name)


def use_branch(unused: bool, step: int, rank: int) -> bool:
    """Whether the extra head is used: always, or (``unused``) not on some ranks at most steps and
    on no rank every fourth step."""
    return not unused or (step % 4 != 0 and (step + rank) % 3 != 0)


class ConvNet(CNN):
    """ddp.py's CNN with bias-free convolutions: a bias before BatchNorm gets no gradient
    but rounding noise, which Adam's normalisation blows up (any two summation orders then differ)."""

    def __init__(self) -> None:
        super().__init__()
        for i in (0, 3):
            conv = self.features[i]
            self.features[i] = nn.Conv2d(conv.in_channels, conv.out_channels, 3, padding=1, bias=False)


def new_model(kind: str) -> nn.Module:
    """``mlp``, ``cnn``, or ``cnn-cl``: the CNN in channels-last memory (its gradients too)."""
    torch.manual_seed(0)
    if kind == "mlp":
        return MLP()
    model = ConvNet()
    return model.to(memory_format=torch.channels_last) if kind == "cnn-cl" else model


def train_ddp(kind: str, opt_name: str, group: Any, unused: bool,
              steps: int = STEPS) -> Dict[str, torch.Tensor]:
    """The reference: DDP over ``group`` and the plain optimizer; the final parameters."""
    rank = dist.get_rank()
    model = new_model(kind)
    ddp = DDP(model, process_group=group, find_unused_parameters=unused)
    opt = make_optimizer(opt_name, model)
    loss_fn = F.mse_loss if kind == "mlp" else F.cross_entropy
    for step in range(steps):
        x, y = batch(kind, rank, step)
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x, use_branch(unused, step, rank)), y).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def train_scheduled(kind: str, opt_name: str, unused: bool, steps: int = STEPS) -> Dict[str, torch.Tensor]:
    """The same training with a ScheduledOptimizer over the pycoll default group."""
    rank = dist.get_rank()
    model = new_model(kind)
    opt = ScheduledOptimizer(model, make_optimizer(opt_name, model), partition_bytes=PARTITION_BYTES,
                             credit_bytes=CREDIT_BYTES, tuning="off")
    loss_fn = F.mse_loss if kind == "mlp" else F.cross_entropy
    for step in range(steps):
        x, y = batch(kind, rank, step)
        opt.zero_grad()
        loss_fn(model(x, use_branch(unused, step, rank)), y).backward()
        opt.step()
    opt.synchronize()
    what = f"{kind}/{opt_name}"
    assert all(p.grad is None for p in model.parameters()), f"{what}: gradients left after synchronize"
    assert opt.step_count == steps, (what, opt.step_count)
    check_priorities(kind, opt)
    out = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.close()
    return out


def check_priorities(kind: str, opt: ScheduledOptimizer) -> None:
    """Priority = the index of the parameter's layer in the first forward pass (input first)."""
    if kind == "mlp":
        layers = ["body.0", "body.2", "head", "branch"]
    else:  # conv, BatchNorm, conv, BatchNorm, head, branch
        layers = ["features.0", "features.1", "features.3", "features.4", "head", "branch"]
    names = [n for n, _ in opt.model.named_parameters()]
    for i, layer in enumerate(layers):
        for name in (f"{layer}.weight", f"{layer}.bias"):
            if name in names:
                got = opt.priority(name)
                assert got == i, f"{kind}: {name} has priority {got}, not {i}"


def assert_matches(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], what: str) -> None:
    """Equal within 1e-6 relative, plus 1e-5 of the tensor's largest entry for entries near zero (as
    ddp.py: on more than two ranks the summation order differs from gloo's, and 20 steps
    amplify float32 rounding, most for adaptive optimizers on entries with tiny gradients)."""
    assert got.keys() == want.keys(), what
    for name in want:
        atol = 1e-5 * want[name].abs().max().item()
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=atol,
                                   msg=lambda m, name=name: f"{what} {name}: {m}")


def run_equal() -> None:
    pycoll_pg = dist.distributed_c10d._get_default_group()
    gloo_pg = dist.new_group(backend="gloo")
    cases = [("mlp", "sgd", False), ("mlp", "adamw", False), ("cnn", "sgd", False), ("cnn", "adamw", False),
             ("cnn-cl", "sgd", False),
             ("mlp", "rmsprop", False), ("mlp", "adagrad", False),
             ("mlp", "sgd", True), ("mlp", "adamw", True)]
    exact = 0
    for kind, opt_name, unused in cases:
        what = f"{kind}/{opt_name}{'/unused' if unused else ''}"
        want = train_ddp(kind, opt_name, gloo_pg, unused)
        got = train_scheduled(kind, opt_name, unused)
        assert_matches(got, want, what)
        exact += all(torch.equal(got[n], want[n]) for n in want)
        assert_same_on_every_rank(got, gloo_pg, f"scheduled {what}")
    if dist.get_rank() == 0:
        print(f"{exact}/{len(cases)} cases equal DDP's bit for bit", flush=True)
    check_refusals(gloo_pg)
    check_state(pycoll_pg)


def check_refusals(gloo_pg: Any) -> None:
    model = MLP()
    try:
        ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), process_group=gloo_pg)
    except TypeError as exc:
        assert "pycoll" in str(exc), exc
    else:
        raise AssertionError("a gloo process group was accepted")
    try:
        ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), priorities={"nope": 1},
                           tuning="off")
    except ValueError as exc:
        assert "nope" in str(exc), exc
    else:
        raise AssertionError("a priority for an unknown parameter was accepted")


def check_state(pg: Any) -> None:
    """State of a stepped optimizer is carried over; state_dict/load_state_dict round-trip; the
    priorities override; gradient accumulation refused."""
    model = new_model("mlp")
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    sgd.step()
    sgd.zero_grad()
    opt = ScheduledOptimizer(model, sgd, priorities={"head.weight": -5}, tuning="off")
    assert opt.priority("head.weight") == -5 and opt.priority("head.bias") == 2, opt.priority("head.bias")
    for name, p in model.named_parameters():
        buf = opt.optimizers[name].state[p]["momentum_buffer"]
        assert torch.equal(buf, torch.ones_like(p)), f"{name}: momentum not carried over"
    x, y = batch("mlp", dist.get_rank(), 0)
    F.mse_loss(model(x), y).backward()
    opt.step()
    sd = opt.state_dict()
    before = {n: o.state[p]["momentum_buffer"].clone() for (n, o), p in zip(opt.optimizers.items(),
                                                                           model.parameters())}
    for o in opt.optimizers.values():
        o.state.clear()
    opt.load_state_dict(sd)
    for (n, o), p in zip(opt.optimizers.items(), model.parameters()):
        assert torch.equal(o.state[p]["momentum_buffer"], before[n]), f"{n}: state_dict round trip"
    loss = model.head.bias.sum()  # its backward reads no parameter (which the first one's update changes)
    loss.backward(retain_graph=True)
    try:
        loss.backward()
    except Exception as exc:  # noqa: BLE001 - torch wraps what the hook raised
        assert "one backward pass per step" in str(exc), exc
    else:
        raise AssertionError("a second backward pass before step() was accepted")
    opt.step()
    # a failing update (the same on every rank) is raised in the main thread, by the next forward
    opt.synchronize()

    def broken(*args: Any, **kw: Any) -> None:
        raise RuntimeError("broken optimizer")

    opt.optimizers["body.2.weight"].step = broken
    F.mse_loss(model(x), y).backward()
    try:  # raised by step() if the update already failed, else by the next forward
        opt.step()
        model(x)
        opt.synchronize()
    except pycoll.torch.scheduled.UpdateError as exc:
        assert "body.2.weight" in str(exc) and "broken optimizer" in str(exc), exc
        assert isinstance(exc, pycoll.PycollError)
    else:
        raise AssertionError("a failed update was not raised")
    opt.synchronize()  # raised once
    opt.close()


class Tower(nn.Module):
    """Four 64x64 layers (16 KiB weights: four parts each)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.Tanh())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


DELAY = 0.4
DELAYED_STEPS = (1, 3)
OVERLAP_STEPS = 5
LAST = "layers.6.weight"


def tower_batch(rank: int, step: int) -> tuple:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 64, generator=g), torch.randn(16, 64, generator=g)


def run_overlap() -> None:
    """Rank 1 makes the last layer's gradient ready late: what waits, and what does not."""
    rank = dist.get_rank()
    gloo_pg = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    ref = Tower()
    ddp = DDP(ref, process_group=gloo_pg)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(OVERLAP_STEPS):
        x, y = tower_batch(rank, step)
        ref_opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        ref_opt.step()

    torch.manual_seed(0)
    model = Tower()
    opt = ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                             partition_bytes=PARTITION_BYTES, credit_bytes=CREDIT_BYTES, tuning="off")
    events: List[tuple] = []  # (what, step, time)
    sched = opt.scheduler
    submit = sched.submit

    def late_submit(name: str, tensor: Any, priority: int = 0, **kw: Any) -> Any:
        if rank == 1 and name == LAST and opt.step_count in DELAYED_STEPS:
            entry = submit(name, tensor, priority, ready=False, **kw)
            threading.Timer(DELAY, sched.notify_ready, (name,)).start()
            return entry
        return submit(name, tensor, priority, **kw)

    sched.submit = late_submit
    last_opt = opt.optimizers[LAST]
    last_step = last_opt.step

    def recorded_step(*args: Any, **kw: Any) -> Any:
        out = last_step(*args, **kw)  # the k-th call updates with the gradient of step k
        events.append(("last updated", sum(e[0] == "last updated" for e in events), time.monotonic()))
        return out

    last_opt.step = recorded_step
    # registered after the optimizer's own pre-hooks: they run once the layer may start
    model.layers[0].register_forward_pre_hook(
        lambda m, a: events.append(("layer 0 forward", opt.step_count, time.monotonic())))
    model.layers[6].register_forward_pre_hook(
        lambda m, a: events.append(("last layer forward", opt.step_count, time.monotonic())))
    step_times, outstanding = [], []
    for step in range(OVERLAP_STEPS):
        x, y = tower_batch(rank, step)
        F.mse_loss(model(x), y).backward()
        t0 = time.monotonic()
        opt.step()
        step_times.append(time.monotonic() - t0)
        outstanding.append(not opt.updated(LAST))
    opt.synchronize()

    def at(what: str, step: int) -> float:
        times = [t for w, s, t in events if w == what and s == step]
        assert len(times) == 1, f"{what} at step {step}: {times}"
        return times[0]

    for step in DELAYED_STEPS:
        assert outstanding[step], f"step {step}: the delayed update finished inside step()"
        assert step_times[step] < DELAY / 2, f"step {step}: step() took {step_times[step]:.3f} s"
        updated = at("last updated", step)
        first = at("layer 0 forward", step + 1)
        last = at("last layer forward", step + 1)
        assert first < updated, f"step {step + 1}: layer 0 started {first - updated:.3f} s after the last " \
                                "layer's update finished"
        assert last > updated, f"step {step + 1}: the last layer started before its update finished"
    assert_matches({n: p.detach() for n, p in model.named_parameters()},
                   {n: p.detach() for n, p in ref.named_parameters()}, "overlap")
    opt.close()
    check_trace()


def check_trace() -> None:
    """Under PYCOLL_TRACE: a forward and a backward span per step, an update span per parameter
    and step (in the progress thread's lane, apart from the main thread's)."""
    from pycoll import trace

    tracer = trace.tracer()
    if tracer is None:
        return
    spans = [e for e in tracer.events() if e.get("ph") == "X"]
    by_cat: Dict[str, List[dict]] = {}
    for e in spans:
        by_cat.setdefault(e["cat"], []).append(e)
    assert len(by_cat.get("forward", [])) == OVERLAP_STEPS, sorted(by_cat)
    assert len(by_cat.get("backward", [])) == OVERLAP_STEPS, sorted(by_cat)
    updates = by_cat.get("update", [])
    assert len(updates) == OVERLAP_STEPS * 8, len(updates)
    assert {e["tid"] for e in updates}.isdisjoint({e["tid"] for e in by_cat["forward"]})


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("pycoll")
    mode = sys.argv[1] if len(sys.argv) > 1 else "equal"
    main: Callable[[], None] = {"equal": run_equal, "overlap": run_overlap}[mode]
    try:
        run_torch_rank(main)
    finally:
        dist.destroy_process_group()
