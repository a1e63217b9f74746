"""Every torch.distributed call on backend ``pycoll`` against ``gloo`` and a local reference.

The default group is ``pycoll``; a ``gloo`` group over the same ranks runs the same calls. Inputs
are small integers (exact in every dtype, so sums agree bit for bit whatever the order), built
from a seed per rank so that every rank can compute the reference result of any call itself.
"""

import datetime
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

import pycoll
import pycoll.torch  # noqa: F401 - registers the backend
from tests.rank import run_torch_rank

RED = dist.ReduceOp
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]
FLOAT_OPS = [RED.SUM, RED.PRODUCT, RED.MIN, RED.MAX, RED.AVG]
INT_OPS = FLOAT_OPS + [RED.BAND, RED.BOR, RED.BXOR]


def data(rank, shape, dtype, salt=0):
    """Rank ``rank``'s input: small integers (1..3 for products, 0..7 otherwise)."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(1, 4, shape, generator=g).to(dtype)


def reference(op, xs, n):
    acc = xs[0].to(torch.float64) if xs[0].is_floating_point() else xs[0].clone()
    if acc.is_complex():
        acc = acc.to(torch.complex128)
    for x in xs[1:]:
        x = x.to(acc.dtype)
        if op in (RED.SUM, RED.AVG):
            acc = acc + x
        elif op == RED.PRODUCT:
            acc = acc * x
        elif op == RED.MIN:
            acc = torch.minimum(acc, x)
        elif op == RED.MAX:
            acc = torch.maximum(acc, x)
        elif op == RED.BAND:
            acc = acc & x
        elif op == RED.BOR:
            acc = acc | x
        elif op == RED.BXOR:
            acc = acc ^ x
    if op == RED.AVG:
        acc = acc / n if acc.is_floating_point() else torch.div(acc, n, rounding_mode="trunc")
    return acc.to(xs[0].dtype)


def check(got, want, what):
    tol = {torch.float16: 1e-3, torch.bfloat16: 1e-2}.get(want.dtype, 1e-6)
    if want.is_floating_point():
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")
    elif not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.tolist()}, want {want.tolist()}")


def gloo_ok(op, dtype):
    """Whether gloo implements ``op`` on ``dtype`` (it has no AVG, and no bitwise ops on floats)."""
    return op != RED.AVG and dtype not in (torch.bfloat16,)


def test_allreduce(r, n, gloo):
    for dtype in FLOATS + INTS:
        for op in (INT_OPS if dtype in INTS else FLOAT_OPS):
            if dtype in (torch.uint8, torch.int8) and op == RED.PRODUCT:
                continue  # 3^n overflows a byte differently per backend
            xs = [data(q, (5, 3), dtype, salt=op.value if hasattr(op, "value") else 1) for q in range(n)]
            want = reference(op, xs, n)
            t = xs[r].clone()
            dist.all_reduce(t, op=op)
            check(t, want, f"all_reduce {op} {dtype}")
            if gloo_ok(op, dtype):
                g = xs[r].clone()
                dist.all_reduce(g, op=op, group=gloo)
                check(t, g, f"all_reduce {op} {dtype} vs gloo")
    for dtype in (torch.complex64, torch.complex128):  # torch allows SUM (and AVG) on complex
        for op in (RED.SUM,):
            xs = [data(q, (4,), dtype, salt=9) * (1 + 1j) for q in range(n)]
            t = xs[r].clone()
            dist.all_reduce(t, op=op)
            check(t, reference(op, xs, n), f"all_reduce {op} {dtype}")
    # PREMUL_SUM (NCCL's; gloo has none): every input times the factor (a number or a tensor), summed
    for factor in (2.5, torch.tensor([0.5])):
        op = dist._make_nccl_premul_sum(factor)
        xs = [data(q, (6,), torch.float64, salt=3) for q in range(n)]
        want = sum(x * factor for x in xs)
        t = xs[r].clone()
        dist.all_reduce(t, op=op)
        check(t, want, f"all_reduce PREMUL_SUM({factor})")
        out = torch.zeros(2, dtype=torch.float64)
        big = torch.cat([xs[r]] * n)[: 2 * n].clone()
        kept = big.clone()
        dist.reduce_scatter_tensor(out, big, op=op)
        check(out, sum(torch.cat([x] * n)[: 2 * n] * factor for x in xs)[2 * r: 2 * r + 2],
              f"reduce_scatter_tensor PREMUL_SUM({factor})")
        check(big, kept, "reduce_scatter_tensor PREMUL_SUM leaves its input")
        t = xs[r].clone()
        dist.reduce(t, dst=n - 1, op=op)
        check(t, want if r == n - 1 else xs[r], f"reduce PREMUL_SUM({factor}): root's result, others' inputs")
    # bool: SUM is logical OR and PRODUCT logical AND, as gloo computes them
    for op in (RED.SUM, RED.PRODUCT, RED.MAX, RED.MIN):
        flags = [torch.tensor([q % 2 == 0, q == 0, True, False, q == n - 1]) for q in range(n)]
        t, g = flags[r].clone(), flags[r].clone()
        dist.all_reduce(t, op=op)
        dist.all_reduce(g, op=op, group=gloo)
        check(t, g, f"all_reduce {op} bool vs gloo")
    # sparse COO (SUM): every rank's entries added up, as gloo does; overlapping indices too
    for dense in ((), (3,)):
        idx = torch.tensor([[r, r + 1, 0], [0, 1, r % 2]])
        val = torch.arange(3 * (dense[0] if dense else 1), dtype=torch.float32).reshape(3, *dense) + r
        t = torch.sparse_coo_tensor(idx, val, (n + 1, 2, *dense))
        g = t.clone()
        dist.all_reduce(t)
        dist.all_reduce(g, group=gloo)
        check(t.to_dense(), g.to_dense(), f"all_reduce of a sparse tensor (dense part {dense}) vs gloo")
    # a non-contiguous tensor: reduced through a copy, written back in place
    base = data(r, (6, 4), torch.float32) * 0 + (r + 1)
    view = base.t()[:, ::2]
    before = base.clone()
    dist.all_reduce(view)
    want_view = before.t()[:, ::2] * 0 + sum(range(1, n + 1))
    check(view, want_view, "all_reduce non-contiguous")
    check(base.t()[:, 1::2], before.t()[:, 1::2], "all_reduce non-contiguous: other elements untouched")
    # zero elements, and a larger message (shared-memory path) against gloo
    empty = torch.empty(0)
    dist.all_reduce(empty)
    big = data(r, (1 << 20,), torch.float32)
    g = big.clone()
    dist.all_reduce(big)
    dist.all_reduce(g, group=gloo)
    check(big, g, "all_reduce 4 MiB vs gloo")


def test_async_future(r, n):
    """An async all_reduce's future completes while the caller computes, without wait()."""
    t = torch.ones(1 << 16)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    deadline = time.monotonic() + 20
    x = torch.randn(64, 64)
    while not fut.done():
        x = x @ x.t() / 64  # the caller computes; pycoll's progress thread finishes the work
        if time.monotonic() > deadline:
            raise AssertionError("async all_reduce did not complete without wait()")
    assert work.is_completed() and work.is_success()
    check(fut.value()[0], torch.full((1 << 16,), float(n)), "async all_reduce future value")
    # chained callbacks run on completion, as DDP's do
    t2 = torch.ones(8)
    fut2 = dist.all_reduce(t2, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check(fut2.wait(), torch.full((8,), 2.0 * n), "future.then")
    # wait() with timedelta(0) means no timeout
    w = dist.all_reduce(torch.ones(4), async_op=True)
    assert w.wait(datetime.timedelta(0))
    # a wait that runs out raises pycoll's TimeoutError; the collective goes on and finishes once
    # the late rank joins
    late = torch.ones(4)
    if r == 0:
        w = dist.all_reduce(late, async_op=True)
        try:
            w.wait(datetime.timedelta(seconds=0.2))
        except pycoll.TimeoutError as exc:
            assert "did not finish within" in str(exc), exc
            # (in the words torch's own tests look for, as gloo's: " Timed out waiting 200ms ")
            assert isinstance(exc, dist.DistBackendError) and " Timed out waiting 200ms " in str(exc), exc
        else:
            raise AssertionError("wait() returned before the other ranks joined")
        w.wait()
    else:
        time.sleep(1.0)  # join late (collectives still in the same order on every rank)
        dist.all_reduce(late)
    check(late, torch.full((4,), float(n)), "all_reduce after a timed-out wait")


def test_coalesced(r, n, gloo):
    ts = [data(r, (k + 1,), torch.float32) for k in range(3)]
    want = [reference(RED.SUM, [data(q, (k + 1,), torch.float32) for q in range(n)], n) for k in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for k in range(3):
        check(ts[k], want[k], f"coalesced all_reduce {k}")
    outs = [torch.empty(n * (k + 1)) for k in range(2)]
    with dist._coalescing_manager():
        for k in range(2):
            dist.all_gather_into_tensor(outs[k], data(r, (k + 1,), torch.float32))
    for k in range(2):
        want = torch.cat([data(q, (k + 1,), torch.float32) for q in range(n)])
        check(outs[k], want, "coalesced all_gather")
    # all_gather_coalesced: one output list per rank, inputs of different shapes; as gloo does
    ins = [data(r, (2, 2), torch.float32), data(r, (3,), torch.float32, salt=1)]
    for group in (None, gloo):
        got = [[torch.zeros(2, 2), torch.zeros(3)] for _ in range(n)]
        dist.all_gather_coalesced(got, ins, group=group)
        if group is None:
            mine = got
    for q in range(n):
        check(mine[q][0], got[q][0], f"all_gather_coalesced rank {q}'s first tensor vs gloo")
        check(mine[q][1], got[q][1], f"all_gather_coalesced rank {q}'s second tensor vs gloo")
        check(mine[q][1], data(q, (3,), torch.float32, salt=1), f"all_gather_coalesced rank {q}")
    rs = [torch.empty(k + 1) for k in range(2)]
    with dist._coalescing_manager():
        for k in range(2):
            dist.reduce_scatter_tensor(rs[k], data(r, (n * (k + 1),), torch.float32))
    for k in range(2):
        full = reference(RED.SUM, [data(q, (n * (k + 1),), torch.float32) for q in range(n)], n)
        check(rs[k], full[r * (k + 1):(r + 1) * (k + 1)], "coalesced reduce_scatter")
    # start/end coalescing around point to point (the device path of the coalescing manager)
    pg = dist.distributed_c10d._get_default_group()
    pg._start_coalescing(torch.device("cpu"))
    a = torch.full((3,), float(r))
    b = torch.empty(3)
    dist.isend(a, (r + 1) % n)
    dist.irecv(b, (r - 1) % n)
    pg._end_coalescing(torch.device("cpu")).wait()
    check(b, torch.full((3,), float((r - 1) % n)), "coalesced send/recv")


def test_data_movement(r, n, gloo):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
        for root in range(n):
            t = data(r, (7,), dtype, salt=root)
            g = t.clone()
            dist.broadcast(t, root)
            dist.broadcast(g, root, group=gloo) if dtype != torch.bfloat16 else None
            check(t, data(root, (7,), dtype, salt=root), f"broadcast {dtype} root {root}")
        x = data(r, (2, 3), dtype)
        outs = [torch.empty(2, 3, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, x)
        for q in range(n):
            check(outs[q], data(q, (2, 3), dtype), f"all_gather {dtype}")
        out = torch.empty(2 * n, 3, dtype=dtype)
        dist.all_gather_into_tensor(out, x)
        check(out, torch.cat([data(q, (2, 3), dtype) for q in range(n)]), f"all_gather_into_tensor {dtype}")
    # reductions to a root and reduce-scatter
    for dtype in (torch.float32, torch.float64, torch.int32, torch.float16):
        for op in (RED.SUM, RED.MAX):
            for root in range(n):
                xs = [data(q, (4,), dtype, salt=root + 7) for q in range(n)]
                t = xs[r].clone()
                dist.reduce(t, root, op=op)
                if r == root:
                    check(t, reference(op, xs, n), f"reduce {op} {dtype} root {root}")
            ins = [data(r, (3,), dtype, salt=q) for q in range(n)]
            out = torch.empty(3, dtype=dtype)
            dist.reduce_scatter(out, ins, op=op)
            want = reference(op, [data(q, (3,), dtype, salt=r) for q in range(n)], n)
            check(out, want, f"reduce_scatter {op} {dtype}")
            if dtype != torch.float16:
                g = torch.empty(3, dtype=dtype)
                dist.reduce_scatter(g, [i.clone() for i in ins], op=op, group=gloo)
                check(out, g, f"reduce_scatter {op} {dtype} vs gloo")
            full = torch.cat(ins)
            out2 = torch.empty(3, dtype=dtype)
            dist.reduce_scatter_tensor(out2, full, op=op)
            check(out2, want, f"reduce_scatter_tensor {op} {dtype}")
    # gather and scatter from every root
    for root in range(n):
        x = data(r, (5,), torch.float32, salt=root)
        outs = [torch.empty(5) for _ in range(n)] if r == root else None
        dist.gather(x, outs, dst=root)
        if r == root:
            for q in range(n):
                check(outs[q], data(q, (5,), torch.float32, salt=root), f"gather root {root}")
        chunks = [data(q, (4,), torch.int64, salt=root + 50) for q in range(n)] if r == root else None
        out = torch.empty(4, dtype=torch.int64)
        dist.scatter(out, chunks, src=root)
        check(out, data(r, (4,), torch.int64, salt=root + 50), f"scatter root {root}")
    # all to all: lists of uneven tensors, and single tensors with and without split sizes
    ins = [torch.full((r + q + 1,), float(10 * r + q)) for q in range(n)]
    outs = [torch.empty(q + r + 1) for q in range(n)]
    dist.all_to_all(outs, ins)
    for q in range(n):
        check(outs[q], torch.full((q + r + 1,), float(10 * q + r)), "all_to_all lists")
    x = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    y = torch.empty(2 * n)
    dist.all_to_all_single(y, x)
    want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * q for q in range(n)])
    check(y, want, "all_to_all_single")
    insplit = [q + 1 for q in range(n)]  # rank r sends q+1 rows to rank q
    outsplit = [r + 1] * n
    x = torch.full((sum(insplit), 2), float(r))
    y = torch.empty(sum(outsplit), 2)
    dist.all_to_all_single(y, x, outsplit, insplit)
    want = torch.cat([torch.full((r + 1, 2), float(q)) for q in range(n)])
    check(y, want, "all_to_all_single with splits")
    g = torch.empty(sum(outsplit), 2)
    dist.all_to_all_single(g, x, outsplit, insplit, group=gloo)
    check(y, g, "all_to_all_single with splits vs gloo")
    dist.barrier()


def test_point_to_point(r, n):
    nxt, prv = (r + 1) % n, (r - 1) % n
    out = torch.empty(4)
    if r % 2 == 0:
        dist.send(torch.full((4,), float(r)), nxt)
        dist.recv(out, prv)
    else:
        dist.recv(out, prv)
        dist.send(torch.full((4,), float(r)), nxt)
    check(out, torch.full((4,), float(prv)), "send/recv")
    reqs = [dist.isend(torch.full((2,), float(r), dtype=torch.float64), nxt, tag=7),
            dist.irecv(buf := torch.empty(2, dtype=torch.float64), prv, tag=7)]
    for q in reqs:
        q.wait()
    check(buf, torch.full((2,), float(prv), dtype=torch.float64), "isend/irecv with tag")
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(r)), nxt),
           dist.P2POp(dist.irecv, b2 := torch.empty(3), prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check(b2, torch.full((3,), float(prv)), "batch_isend_irecv")
    # any source: rank 0 receives one message from every other rank, in whatever order they come
    if r == 0:
        seen = set()
        for _ in range(n - 1):
            buf = torch.empty(1, dtype=torch.int64)
            src = dist.recv(buf, tag=3)
            assert int(buf) == 100 + src, (int(buf), src)
            seen.add(src)
        assert seen == set(range(1, n)), seen
    else:
        dist.send(torch.tensor([100 + r]), 0, tag=3)
    dist.barrier()


def test_groups(r, n):
    """Sub-groups map to their own pycoll teams, made only on their members."""
    sub = dist.new_group([0, n - 1])
    if r in (0, n - 1):
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=sub)
        check(t, torch.tensor([float(n - 1)]), "sub-group all_reduce")
        assert dist.get_backend(sub) == "pycoll"
    odd = dist.new_group([q for q in range(n) if q % 2])
    if r % 2:
        t = torch.ones(3)
        dist.all_reduce(t, group=odd)
        check(t, torch.full((3,), float(len(range(1, n, 2)))), "odd-ranks group")
    from torch.distributed import _functional_collectives as fc

    out = fc.all_reduce(torch.ones(2) * r, "sum", dist.group.WORLD)
    check(out, torch.full((2,), float(sum(range(n)))), "functional all_reduce (group by name)")
    dist.barrier()


def bad_calls(r, n):
    """(name, call(group)) of calls every rank makes with arguments gloo rejects."""
    yield "BAND on float", lambda g: dist.all_reduce(torch.ones(2), op=RED.BAND, group=g)
    yield "all_gather list too short", lambda g: dist.all_gather([torch.zeros(2)], torch.ones(2), group=g)
    yield "all_gather tensors of another size", lambda g: dist.all_gather([torch.zeros(3)] * n, torch.ones(2),
                                                                         group=g)
    yield "all_gather_into_tensor of the wrong size", lambda g: dist.all_gather_into_tensor(
        torch.zeros(2 * n + 1), torch.ones(2), group=g)
    yield "all_to_all_single split sizes that do not add up", lambda g: dist.all_to_all_single(
        torch.zeros(4), torch.ones(4), [1] * n, [3] * n, group=g)
    yield "all_reduce of tensors of different dtypes", lambda g: dist.all_reduce_coalesced(
        [torch.ones(2), torch.ones(2, dtype=torch.float64)], group=g)


def test_errors(r, n, gloo):
    """Where gloo rejects a call, pycoll rejects it with an error of gloo's type (a RuntimeError:
    pycoll's is a ValueError too), and the group stays usable."""
    for name, call in bad_calls(r, n):
        caught = []
        for group in (gloo, None):
            try:
                call(group)
            except Exception as exc:  # noqa: BLE001 - the type is what is compared
                caught.append(exc)
            else:
                caught.append(None)
        theirs, ours = caught
        assert theirs is not None and ours is not None, f"{name}: gloo raised {theirs!r}, pycoll {ours!r}"
        assert isinstance(ours, type(theirs)), f"{name}: gloo raised {type(theirs)}, pycoll {type(ours)}"
        t = torch.ones(3)
        dist.all_reduce(t)
        check(t, torch.full((3,), float(n)), f"all_reduce after {name}")
    dist.barrier()


def test_vanished_peer(r, n):
    """The last rank dies after a barrier: the others' next all_reduce fails with a pycoll error
    naming a lost rank (the dead one, or one that already failed and left), long before the group's
    timeout."""
    dist.barrier()
    if r == n - 1:
        print(f"RANK {r} OK", flush=True)
        os._exit(0)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 12))
        dist.all_reduce(torch.ones(1 << 12))
    except Exception as exc:  # noqa: BLE001 - checked below
        assert isinstance(exc, pycoll.PycollError), f"{type(exc).__name__}: {exc}"
        assert isinstance(exc, dist.DistBackendError), f"{type(exc).__name__}: {exc}"  # as torch's backends
        assert "has died" in str(exc) or "lost rank" in str(exc), exc
        assert time.monotonic() - start < 20, "the error came only at the timeout"
    else:
        raise AssertionError("all_reduce with a dead peer did not fail")
    print(f"RANK {r} OK", flush=True)
    os._exit(0)  # no clean shutdown with a dead peer


def test_mismatch(r, n):
    """The last rank all_reduces one element more than the others: every rank raises a
    DistBackendError (what torch's backends raise) that is pycoll's MismatchError naming each
    rank's call, never a result."""
    t = torch.ones(100 + (r == n - 1))
    try:
        dist.all_reduce(t)
    except dist.DistBackendError as exc:
        assert isinstance(exc, pycoll.MismatchError), f"{type(exc).__name__}: {exc}"
        assert "allreduce 100 x float32 sum" in str(exc) and "allreduce 101 x float32 sum" in str(exc), exc
    else:
        raise AssertionError(f"rank {r}: all_reduce of ranks that disagree returned {t[:3]}")
    print(f"RANK {r} OK", flush=True)
    # rank 0 hosts the store: it stays until every rank has raised (a rank still joining the group
    # when the others have seen the mismatch would lose the store under it)
    store = dist.distributed_c10d._get_default_store()
    store.set(f"mismatch-raised-{r}", "1")
    if r == 0:
        store.wait([f"mismatch-raised-{q}" for q in range(n)], datetime.timedelta(seconds=50))
    os._exit(0)  # the group's segment is unusable after a mismatch


def test_repeated(r, n):
    """Synchronous calls repeated on the same tensor: the group passes the team the same view, so
    the team runs them as a persistent collective; a tensor re-pointed in place (``set_``) gets a
    new view (and a new call), never the old memory."""
    from pycoll.torch.backend import ProcessGroupPycoll

    pg = dist.distributed_c10d._get_default_group()
    assert isinstance(pg, ProcessGroupPycoll)
    t = torch.zeros(4)
    for i in range(50):
        t.fill_(r + i)
        dist.all_reduce(t)
        check(t, torch.full((4,), float(sum(q + i for q in range(n)))), f"repeated all_reduce {i}")
        t.fill_(i if r == 0 else -1)
        dist.broadcast(t, 0)
        check(t, torch.full((4,), float(i)), f"repeated broadcast {i}")
    arr = pg.views.of(t)
    entry = pg.team.recent.get(("allreduce", id(arr)))
    assert entry is not None and entry.persistent is not None, "the repeats ran as a persistent collective"
    other = torch.empty(64)
    t.set_(other)  # another storage and size, in place (resize_ is refused once numpy viewed it)
    t.fill_(2.0)
    dist.all_reduce(t)
    check(other, torch.full((64,), 2.0 * n), "all_reduce after set_")
    for _ in range(3):
        dist.all_reduce(t)  # repeats of the new memory
    check(other, torch.full((64,), 2.0 * n ** 4), "repeats after set_")
    t.fill_(1.0)
    works = [dist.all_reduce(t, async_op=True) for _ in range(3)]  # repeats in flight together
    for w in works:
        w.wait()
    check(t, torch.full((64,), float(n ** 3)), "repeats in flight")
    same_size = torch.empty(64)
    t.set_(same_size)  # another storage of the same size: only the address tells
    t.fill_(1.0)
    dist.all_reduce(t)
    check(same_size, torch.full((64,), float(n)), "all_reduce after set_ to the same size")


def test_tensors_as_users_hold_them(r, n, gloo):
    """Parameters (leaves that require grad) in channels-last or transposed layout, negative
    views, storage resized after a call, PREMUL_SUM edge cases and the future values of list
    outputs: each as gloo (or, where gloo has none, the local reference)."""
    torch.manual_seed(r)
    for layout in ("channels_last", "transposed"):
        conv = torch.nn.Conv2d(3, 4, 3)
        if layout == "channels_last":
            conv = conv.to(memory_format=torch.channels_last)
            p = conv.weight
        else:
            p = torch.nn.Parameter(torch.randn(5, 3).t())
        ref = p.detach().clone()
        dist.broadcast(ref, src=0, group=gloo)
        dist.broadcast(p, src=0)  # (the usual "sync the initial weights" loop)
        check(p.detach(), ref, f"broadcast of a {layout} parameter")
        want = p.detach().clone()
        dist.all_reduce(want, group=gloo)
        dist.all_reduce(p)
        check(p.detach(), want, f"all_reduce of a {layout} parameter")
    # a negated view: its values, as they read, reduced (and written back through it); (torch itself
    # refuses a conjugate view of complex numbers before a backend sees it)
    neg = torch.tensor([1.0, 2.0]) * (r + 1)
    nv = torch._neg_view(neg)
    dist.all_reduce(nv)
    check(nv, -torch.tensor([1.0, 2.0]) * sum(range(1, n + 1)), "all_reduce through a negative view")
    # a tensor's storage stays resizable after a call (gloo's does: FSDP frees storage so)
    buf = torch.zeros(4)
    for _ in range(3):  # (repeats: the call's view is kept)
        dist.all_reduce(buf)
    buf.resize_(8)
    buf.untyped_storage().resize_(0)
    buf = torch.ones(4)
    dist.all_reduce(buf)
    check(buf, torch.full((4,), float(n)), "all_reduce on a new tensor after a resized one")
    # PREMUL_SUM: a one-element tensor factor scales a 0-dim input; a float factor of an int tensor
    # is refused before anything is sent (on every rank alike)
    s = torch.tensor(float(r + 1))
    dist.all_reduce(s, op=dist._make_nccl_premul_sum(torch.tensor([2.0])))
    check(s, torch.tensor(2.0 * sum(range(1, n + 1))), "PREMUL_SUM of a 0-dim tensor")
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist._make_nccl_premul_sum(0.5))
    except ValueError as exc:
        assert "PREMUL_SUM" in str(exc), exc
    else:
        raise AssertionError("PREMUL_SUM of int64 by 0.5 was not refused")
    # a list output's future holds the tensors themselves (gloo's and NCCL's value)
    for group in (None, gloo):
        outs = [torch.zeros(2) for _ in range(n)]
        work = dist.all_gather(outs, torch.full((2,), float(r)), group=group, async_op=True)
        value = work.get_future().wait()
        assert len(value) == n and all(isinstance(v, torch.Tensor) for v in value), (group, value)
        check(torch.stack(value), torch.arange(float(n)).repeat_interleave(2).reshape(n, 2),
              f"all_gather future value ({'gloo' if group else 'pycoll'})")


def main(mode):
    if mode == "vanish":
        dist.init_process_group("pycoll", timeout=datetime.timedelta(seconds=60))
        test_vanished_peer(dist.get_rank(), dist.get_world_size())
    if mode == "mismatch":
        dist.init_process_group("pycoll", timeout=datetime.timedelta(seconds=60))
        test_mismatch(dist.get_rank(), dist.get_world_size())
    dist.init_process_group("pycoll")
    r, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "pycoll"
    gloo = dist.new_group(backend="gloo")
    if mode in ("all", "reduce"):
        test_allreduce(r, n, gloo)
        test_async_future(r, n)
        test_repeated(r, n)
    if mode in ("all", "move"):
        test_coalesced(r, n, gloo)
        test_data_movement(r, n, gloo)
        test_point_to_point(r, n)
        test_groups(r, n)
        test_errors(r, n, gloo)
        test_tensors_as_users_hold_them(r, n, gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's renamed *_into_tensor calls
    torch.set_num_threads(1)
    run_torch_rank(main, sys.argv[1] if len(sys.argv) > 1 else "all")
