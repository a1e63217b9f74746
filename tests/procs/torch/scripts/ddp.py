"""Run by tests/procs/torch/test_torch_ddp.py on every rank: DDP over the ``pycoll`` backend against
DDP over gloo.

Modes:

* ``equal``: train the same models from the same seed for ``STEPS`` steps, each rank on its own
  data, once over a gloo group and once over the pycoll default group, in every DDP variant
  (bucket views, unused parameters, static graph, pycoll's priority hook, small buckets): the
  final parameters and BatchNorm buffers must agree (bit for bit on two ranks in float32; on more,
  trained in float64, within its rounding), and the parameters must be identical on every rank.
* ``priority``: record every task pycoll's engine starts during backward passes under the priority
  hook with several buckets, a small partition size and a small credit: the buckets must be split
  into parts of at most ``partition_bytes`` at priority ``-bucket.index()``, started within the
  credit, and once every bucket is queued, most urgent bucket first (needs ``PYCOLL_TLS=tcp``
  for the credit part: a part on the shared segment holds no credit).
"""

# DDP checks a comm hook's annotations as objects: no ``from __future__ import annotations`` here.
import os
import sys
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - torch's usual name
from torch.nn.parallel import DistributedDataParallel as DDP

import pycoll
import pycoll.torch  # noqa: F401 - registers the "pycoll" backend (and fills env:// under mpiexec)
from pycoll.torch import PriorityHookState, priority_hook
from pycoll.torch.backend import ProcessGroupPycoll
from tests.rank import run_torch_rank

STEPS = 20
BATCH = 8
PARTITION_BYTES = 4096
CREDIT_BYTES = 8192
SMALL_BUCKET_MB = 0.004  # ~4 KiB: three or more buckets for either model


class MLP(nn.Module):
    """Three layers and an extra head, used on the steps ``forward`` is told to."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 8)
        self.branch = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = self.body(x)
        out = self.head(h)
        return out + self.branch(h) if use_branch else out


class CNN(nn.Module):
    """Two conv + BatchNorm layers on 3x8x8 images, a linear head and an extra head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(8 * 8 * 8, 4)
        self.branch = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = self.features(x)
        out = self.head(h)
        return out + self.branch(h) if use_branch else out


def precision() -> torch.dtype:
    """float32 on two ranks (every allreduce adds the same two numbers: results bit for bit equal);
    float64 on more. There pycoll sums in rank order and gloo in ring order, a float32 rounding
    apart, and 20 steps through ReLUs and BatchNorm can turn one rounding into a flipped activation
    and a gradient 1e-3 off (seen with gradient_as_bucket_view on 3 ranks: every allreduce exact for
    its inputs, the runs apart from step 4 on). In float64 the roundings are 1e-16 apart."""
    return torch.float32 if dist.get_world_size() == 2 else torch.float64


def batch(kind: str, rank: int, step: int) -> tuple:
    """This rank's inputs and targets at ``step`` (different on every rank, the same every run)."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    if kind == "mlp":
        return torch.randn(BATCH, 32, generator=g), torch.randn(BATCH, 8, generator=g)
    return torch.randn(BATCH, 3, 8, 8, generator=g), torch.randint(0, 4, (BATCH,), generator=g)


def train(kind: str, group: Any, variant: str, hook: bool) -> Dict[str, torch.Tensor]:
    """Train a fresh ``kind`` model under DDP over ``group`` for STEPS steps; its final state."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = MLP() if kind == "mlp" else CNN()
    dtype = precision()
    model = model.to(dtype)
    kwargs: Dict[str, Any] = {"process_group": group}
    if variant == "bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    elif variant == "unused":
        kwargs["find_unused_parameters"] = True
    elif variant == "static":
        kwargs["static_graph"] = True
    elif variant == "small_buckets":
        kwargs["bucket_cap_mb"] = SMALL_BUCKET_MB
    ddp = DDP(model, **kwargs)
    state = None
    if hook:
        state = PriorityHookState(process_group=group, partition_bytes=PARTITION_BYTES,
                                  credit_bytes=CREDIT_BYTES)
        ddp.register_comm_hook(state, priority_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = F.mse_loss if kind == "mlp" else F.cross_entropy
    for step in range(STEPS):
        x, y = batch(kind, rank, step)
        x, y = x.to(dtype), (y.to(dtype) if y.is_floating_point() else y)
        # "unused": the extra head sits out a different step on each rank (and on some steps on all)
        use_branch = (step + rank) % 3 != 0 if variant == "unused" else True
        opt.zero_grad(set_to_none=False)
        loss_fn(ddp(x, use_branch), y).backward()
        opt.step()
    if state is not None:  # the hook did the communication (after step 0, DDP rebuilds the buckets)
        least = 1 + (3 if variant == "small_buckets" else 1) * (STEPS - 1)
        assert state.buckets_posted >= least, f"{kind}/{variant}: the priority hook posted " \
                                              f"{state.buckets_posted} buckets in {STEPS} steps"
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def parameters(sd: Dict[str, torch.Tensor], kind: str) -> Dict[str, torch.Tensor]:
    """The parameters among a state dict's entries (the rest are BatchNorm buffers)."""
    names = {n for n, _ in (MLP() if kind == "mlp" else CNN()).named_parameters()}
    return {k: v for k, v in sd.items() if k in names}


def assert_same_on_every_rank(params: Dict[str, torch.Tensor], group: Any, what: str) -> None:
    """DDP keeps replicas identical: every rank must hold bit for bit rank 0's parameters. (Not the
    BatchNorm buffers: rank 0 broadcasts them before each forward, which then updates them with
    each rank's own batch.)"""
    flat = torch.cat([v.reshape(-1).double() for v in params.values()])
    ref = flat.clone()
    dist.broadcast(ref, 0, group=group)
    assert torch.equal(flat, ref), f"{what}: rank {dist.get_rank()} differs from rank 0 by " \
                                   f"{(flat - ref).abs().max().item():.3g}"


def assert_equal_training(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """pycoll's result against gloo's. On two ranks every allreduce algorithm adds the same two
    numbers: bit for bit equal. On more, the summation order differs (rounding, which 20 steps of
    training amplify; the models train in float64 there, see :func:`precision`): equal within 1e-9
    relative, plus 1e-8 of the tensor's largest entry for entries near zero."""
    if dist.get_world_size() == 2:
        assert torch.equal(got, want), f"{what}: differs by {(got - want).abs().max().item():.3g} on 2 ranks"
        return
    atol = 1e-8 * want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=atol, msg=lambda m: f"{what}: {m}")


def run_equal() -> None:
    """Every model and variant: pycoll's result against gloo's."""
    pycoll_pg = dist.distributed_c10d._get_default_group()
    gloo_pg = dist.new_group(backend="gloo")
    ctx = pycoll_pg.ctx
    settings = (ctx.partition_bytes, ctx.credit_bytes)
    variants = ["default", "bucket_view", "unused", "static", "hook", "small_buckets"]
    for kind in ("mlp", "cnn"):
        for variant in variants:
            hook = variant in ("hook", "small_buckets")
            want = train(kind, gloo_pg, variant, hook=False)
            got = train(kind, pycoll_pg, variant, hook=hook)
            # the hook set the engine's partition and credit: restore them for the next variant
            ctx.partition_bytes, ctx.credit_bytes = settings
            what = f"{kind}/{variant}"
            assert want.keys() == got.keys(), what
            for name in want:
                assert_equal_training(got[name], want[name], f"{what} {name}")
            assert_same_on_every_rank(parameters(got, kind), gloo_pg, f"pycoll {what}")


class Tower(nn.Module):
    """Five 48x48 layers: with ~8 KiB buckets, one bucket of 9,408 B (three parts) per layer."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(48, 48), nn.Tanh())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Recorder:
    """Spies on the engine during backward passes under the priority hook.

    ``on_start`` sees every task the engine starts (with the credit in flight before it and whether
    a peer's start forced it); the hook notes each bucket's index and the collective it posted.
    With ``hold`` set, the hook keeps the engine's lock from bucket 0 to the last bucket, so the
    engine must choose among every bucket's queued parts at once (DDP posts bucket 0 first)."""

    def __init__(self, pg: ProcessGroupPycoll) -> None:
        self.pg, self.ctx = pg, pg.ctx
        self.started: List[tuple] = []  # (task, priority, in_flight before, demand start, all posted)
        self.buckets: List[tuple] = []  # (index, bytes, priority asked for, the collective posted)
        self.hold = False
        self.posted_all = False
        self._demand = 0
        self._post = pg.allreduce_scheduled

    def on_start(self, task: Any) -> None:
        # started by a peer's message, or by the engine standing still (not by the credit's choice)
        n = self.ctx.stats["demand_starts"] + self.ctx.stats.get("stall_starts", 0)
        prio = task.effective_priority
        self.started.append((task, prio, self.ctx.in_flight, n != self._demand, self.posted_all))
        self._demand = n

    def hook(self, state: PriorityHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        index = bucket.index()
        if self.hold and index == 0:
            self.ctx.lock.acquire()
        self.pg.allreduce_scheduled = lambda t, priority=0, **kw: self._spy(index, t, priority, **kw)
        try:
            fut = priority_hook(state, bucket)
        finally:
            del self.pg.allreduce_scheduled
        if self.hold and bucket.is_last():
            self.posted_all = True
            self.ctx.lock.release()
        return fut

    def _spy(self, index: int, tensor: torch.Tensor, priority: int, **kw: Any) -> Any:
        work = self._post(tensor, priority=priority, **kw)
        nbytes = tensor.numel() * tensor.element_size()
        self.buckets.append((index, nbytes, priority, work.watch.requests[0].task))
        return work

    def reset(self, hold: bool) -> None:
        self.started, self.buckets, self.hold, self.posted_all = [], [], hold, False


def units(top: Any) -> List[Any]:
    """The units of credit of one posted allreduce: its parts, or itself when it was not split."""
    return list(top.tasks) if "/parts@" in top.name else [top]


def run_priority() -> None:
    """Backward passes under the priority hook; check what the engine started, and in what order."""
    pg = dist.distributed_c10d._get_default_group()
    assert isinstance(pg, ProcessGroupPycoll), pg
    ctx = pg.ctx
    torch.manual_seed(0)
    ddp = DDP(Tower(), bucket_cap_mb=0.008)
    rec = Recorder(pg)
    ddp.register_comm_hook(PriorityHookState(partition_bytes=PARTITION_BYTES, credit_bytes=CREDIT_BYTES),
                           rec.hook)
    overtakes, credited = 0, 0
    ctx.on_start = rec.on_start
    try:
        # at least 6 steps; then on until a later bucket overtook an earlier one on every rank
        # (whether one does in a given step depends on when the buckets' parts get queued: timing;
        # the ranks agree on when to stop, as DDP needs), at most 30
        for step in range(30):
            if step >= 6:
                done = torch.tensor([int(bool(overtakes) or not credited)], dtype=torch.int32)
                dist.all_reduce(done, op=dist.ReduceOp.MIN)
                if done.item():
                    break
            rec.reset(hold=step >= 2)  # step 0: one bucket for all (DDP rebuilds them after it)
            x = torch.randn(BATCH, 48, generator=torch.Generator().manual_seed(step + 100 * dist.get_rank()))
            ddp(x).square().mean().backward()
            got = (ctx.partition_bytes, ctx.credit_bytes)
            assert got == (PARTITION_BYTES, CREDIT_BYTES), f"the hook state set partition, credit {got}"
            overtakes += check_step(step, rec)
            credited += sum(1 for t in rec.started if t[0].credit)
    finally:
        ctx.on_start = None
    if credited:  # not when every part lives on the shared segment, or this rank only waits on peers
        assert overtakes, "no part of a later bucket ever started before a queued part of an earlier one"


def check_step(step: int, rec: Recorder) -> int:
    """Check one backward pass; return how often a later-posted bucket's part started before a part
    of an earlier bucket that was already queued (only counted once every bucket is posted)."""
    what = f"step {step}"
    indices = [b[0] for b in rec.buckets]
    assert indices == list(range(len(indices))), f"{what}: buckets posted in order {indices}"
    if step:
        assert len(indices) == 5, f"{what}: expected one bucket per layer, got {len(indices)}"
    order = {id(t[0]): i for i, t in enumerate(rec.started)}
    started = {id(t[0]): t for t in rec.started}
    position: Dict[int, tuple] = {}  # id(part) -> (bucket index, position in start order)
    for index, nbytes, priority, top in rec.buckets:
        assert priority == -index, f"{what}: bucket {index} posted with priority {priority}"
        parts = units(top)
        sizes = [p.nbytes for p in parts]
        assert sum(sizes) == nbytes, f"{what}: bucket {index} of {nbytes} B in parts of {sizes}"
        assert len(parts) == -(-nbytes // PARTITION_BYTES), f"{what}: bucket {index}: parts {sizes}"
        assert max(sizes) <= PARTITION_BYTES, f"{what}: bucket {index}: parts {sizes}"
        for p in parts:
            assert id(p) in started, f"{what}: part {p.name} of bucket {index} never started"
            prio = started[id(p)][1]
            assert prio == -index, f"{what}: part of bucket {index} at priority {prio}"
            # a part holds its bytes of credit, unless this rank's first move is to wait for a peer
            want = p.nbytes if getattr(p, "sends_first", True) else 0
            assert p.credit == want, f"{what}: part {p.name} takes credit {p.credit}, not {want}"
            position[id(p)] = (index, order[id(p)])
    # the credit gate: a part started by the engine's own choice (not because a peer had started it)
    # fits in the credit, or nothing else was in flight
    chosen = [t for t in rec.started if id(t[0]) in position and t[0].credit and not t[3]]
    for task, _prio, in_flight, _demand, _ in chosen:
        assert in_flight == 0 or in_flight + task.credit <= CREDIT_BYTES, \
            f"{what}: {task.name} ({task.credit} B) started with {in_flight} B in flight"
    # the engine's own choices, once every bucket is queued: most urgent first
    prios = [t[1] for t in chosen if t[4]]
    assert prios == sorted(prios), f"{what}: parts started at priorities {prios} once all were posted"
    overtakes = 0
    if rec.posted_all:
        queued = [pid for pid, t in started.items() if pid in position and t[0].credit and t[4]]
        for a in queued:
            for b in queued:
                if position[b][0] > position[a][0] and position[b][1] < position[a][1]:
                    overtakes += 1
    return overtakes


def run_peer_dies() -> None:
    """Rank 1 exits between two steps; rank 0's next backward raises (DDP's reducer gets the
    work's error as a C++ error) instead of crashing the process."""
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    x = torch.randn(32, 16)
    for _ in range(2):  # (the second forward rebuilds the buckets: then only backward talks)
        model(x).pow(2).mean().backward()
    if dist.get_rank() == 1:
        print("RANK 1 OK", flush=True)
        os._exit(0)  # gone without a word
    try:
        model(x).pow(2).mean().backward()
    except RuntimeError as exc:
        # (forward's bucket rebuild raises pycoll's error itself; backward, DDP's wrapping of it)
        assert isinstance(exc, pycoll.PeerLostError) or "PeerLostDistError" in str(exc), repr(exc)
        assert "rank 1" in str(exc), exc
        print("RANK 0 OK", flush=True)
        os._exit(0)  # (the group cannot be destroyed with a peer gone)
    raise AssertionError("backward returned although rank 1 was gone")


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("pycoll")
    mode = sys.argv[1] if len(sys.argv) > 1 else "equal"
    modes = {"equal": run_equal, "priority": run_priority, "peer_dies": run_peer_dies}
    main: Callable[[], None] = modes[mode]
    try:
        run_torch_rank(main)
    finally:
        dist.destroy_process_group()
