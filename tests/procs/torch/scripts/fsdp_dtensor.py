"""What torch users run on a process group today, on ``pycoll`` against ``gloo`` in one job: FSDP2
(``fully_shard``) training, DTensor on a CPU ``DeviceMesh`` and ``torch.distributed.checkpoint``.

The default group is ``pycoll``; a ``gloo`` group over the same ranks runs the same steps from the
same initial weights and data. On two ranks both add the two contributions alike, so losses and
parameters must agree bit for bit; on more, pycoll sums in rank order and gloo in ring order, so
they agree within float32's rounding (``torch.testing.assert_close``'s float32 tolerances).
"""

import shutil
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import pycoll.torch  # noqa: F401 - registers the backend
from tests.rank import run_torch_rank


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


def sharded(mesh):
    m = model()
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(m, mesh=mesh)


def train(mesh, r, steps=6):
    """Losses and full parameters of ``steps`` SGD steps of an FSDP2 model over ``mesh``."""
    m = sharded(mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + r)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return m, losses, [p.full_tensor() for p in m.parameters()]


EXACT = True  # (two ranks: bit for bit; see the module docstring)


def same(a, b, what, exact=None):
    exact = EXACT if exact is None else exact
    a, b = (torch.tensor(a), torch.tensor(b)) if isinstance(a[0], float) else (a, b)
    for i, (x, y) in enumerate(zip(a, b) if isinstance(a, list) else [(a, b)]):
        if exact:
            assert torch.equal(x, y), f"{what} [{i}]: largest difference {(x - y).abs().max().item()}"
        else:
            torch.testing.assert_close(x, y, msg=lambda m, i=i: f"{what} [{i}]: {m}")


def dtensor(mesh, r, n):
    """distribute, redistribute (Shard -> Replicate: an allgather; Partial sums: allreduce), a
    sharded matmul: the values of the plain tensors."""
    torch.manual_seed(1)
    a, b = torch.randn(4 * n, 6), torch.randn(6, 5)
    da = distribute_tensor(a, mesh, [Shard(0)])
    assert da.to_local().shape == (4, 6)
    out = (da @ distribute_tensor(b, mesh, [Replicate()])).redistribute(mesh, [Replicate()])
    rows = distribute_tensor(a, mesh, [Shard(1)]) if a.shape[1] % n == 0 else None
    got = [out.to_local(), da.full_tensor()]
    if rows is not None:
        got.append(rows.sum(dim=1).full_tensor())
    return got


def checkpoint(mesh, trained, r):
    """Save the trained FSDP2 model with torch.distributed.checkpoint, load it into a fresh one:
    the same full parameters."""
    path = [tempfile.mkdtemp(prefix="pycoll-dcp-") if r == 0 else None]
    dist.broadcast_object_list(path, src=0, group=mesh.get_group())
    dcp.save({"model": get_model_state_dict(trained)}, checkpoint_id=path[0], process_group=mesh.get_group())
    fresh = sharded(mesh)
    state = {"model": get_model_state_dict(fresh)}
    dcp.load(state, checkpoint_id=path[0], process_group=mesh.get_group())
    set_model_state_dict(fresh, state["model"])
    dist.barrier(group=mesh.get_group())  # (every rank has loaded it: rank 0 removes it)
    if r == 0:
        shutil.rmtree(path[0])
    return [p.full_tensor() for p in fresh.parameters()]


def main():
    global EXACT
    dist.init_process_group("pycoll")
    r, n = dist.get_rank(), dist.get_world_size()
    EXACT = n <= 2
    gloo = dist.new_group(backend="gloo")
    ours, theirs = DeviceMesh.from_group(dist.group.WORLD, "cpu"), DeviceMesh.from_group(gloo, "cpu")
    m1, losses1, params1 = train(ours, r)
    m2, losses2, params2 = train(theirs, r)
    same(losses1, losses2, "FSDP2 losses, pycoll against gloo")
    same(params1, params2, "FSDP2 parameters, pycoll against gloo")
    same(dtensor(ours, r, n), dtensor(theirs, r, n), "DTensor values, pycoll against gloo")
    same(checkpoint(ours, m1, r), params1, "parameters loaded from a pycoll checkpoint", exact=True)
    same(checkpoint(theirs, m2, r), params2, "parameters loaded from a gloo checkpoint", exact=True)
    dist.barrier()
    if r == 0:
        print(f"FSDP2 losses {losses1[0]:.6f} -> {losses1[-1]:.6f}, the same on gloo", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    run_torch_rank(main, *sys.argv[1:])
