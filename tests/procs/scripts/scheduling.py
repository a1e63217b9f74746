"""pycoll.scheduling on real ranks: python scheduling.py MODE [ARGS].

orders TLS     tensors made ready in a different random order on every rank, credit of one
               partition, some immediate: right sums, nothing waits on anything
trace          (PYCOLL_TRACE set) the trace shows parts started by priority and cut at the
               partition size
tuning         the auto-tuner changes credit and partition on every rank at the same step, and
               both change what is sent
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from pycoll import ReduceOp, Team, trace
from pycoll.scheduling import AutoTuner, Scheduler
from tests.rank import run_rank


def orders(comm: MPI.Comm) -> None:
    team = Team.from_mpi(comm)
    rank, size = team.rank, team.size
    part = 4096
    sched = Scheduler(team, partition_bytes=part, credit_bytes=part, tuning="off", timeout=60)
    rng = np.random.default_rng(1234 + rank)
    sizes = [1, 7, 1000, 1024, 3000, 10000, 33, 5000, 20000, 2048] * 2
    for step in range(3):
        arrays = {f"g{i}": np.full(n, rank + 1 + i + step, np.float32) for i, n in enumerate(sizes)}
        immediate = {"g3", "g11"}
        handles = [sched.submit(name, arr, priority=i, ready=False, immediate=name in immediate)
                   for i, (name, arr) in enumerate(arrays.items())]
        for name in rng.permutation(list(arrays)):  # this rank's own order
            sched.notify_ready(str(name))
            if rng.random() < 0.3:
                team.ctx.progress()
        for h in handles:
            h.wait(timeout=60)
        for i, arr in enumerate(arrays.values()):
            want = sum(r + 1 + i + step for r in range(size))
            assert np.all(arr == want), (i, arr[:4], want)
        counts = [len(h.requests) for h in handles]
        assert counts[:6] == [1, 1, 1, 1, 3, 10], counts
        sched.step()
    assert not sched.pending
    # an AVG and a bad name
    x = np.full(10, float(rank))
    sched.submit("avg", x, 0, op=ReduceOp.AVG).wait(timeout=30)
    assert np.allclose(x, (size - 1) / 2)
    try:
        sched.submit("", x)
    except ValueError:
        pass
    else:
        raise AssertionError("empty name accepted")
    h = sched.submit("twice", x, ready=False)
    try:
        sched.submit("twice", x)
    except ValueError:
        pass
    else:
        raise AssertionError("a name in flight accepted twice")
    sched.notify_ready("twice")
    h.wait(timeout=30)
    print(f"rank {rank} stats {team.ctx.stats}", flush=True)


def traced(comm: MPI.Comm) -> None:
    team = Team.from_mpi(comm)
    part = 8192
    sched = Scheduler(team, partition_bytes=part, credit_bytes=part, tuning="off", timeout=60)
    sizes = {0: 3000, 1: 5000, 2: 100, 3: 9000, 4: 2048}  # float32 counts by priority
    arrays = {}
    with team.ctx.lock:  # all queued before the engine moves: the first starts, the rest queue
        for prio in (4, 3, 2, 1, 0):  # as backward makes them: the output layer first
            arrays[prio] = np.ones(sizes[prio], np.float32)
            sched.submit(f"t{prio}", arrays[prio], priority=prio)
    sched.synchronize(timeout=60)
    sched.step()
    assert all(np.all(a == team.size) for a in arrays.values())
    written = trace.flush()
    comm.Barrier()
    doc = json.load(open(written))
    spans = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["cat"] == "comm"
             and e["name"].startswith("t") and "/part" in e["name"]]
    for prio, n in sizes.items():
        mine = sorted((e for e in spans if e["name"].startswith(f"t{prio}/")),
                      key=lambda e: int(e["name"].rsplit("part", 1)[1]))
        want = [min(part, n * 4 - i) for i in range(0, n * 4, part)]
        assert [e["args"]["nbytes"] for e in mine] == want, (prio, [e["args"] for e in mine])
    queued = [e["args"]["priority"] for e in sorted(spans, key=lambda e: e["ts"])
              if e["args"]["start"] == "queue"]
    assert queued == sorted(queued), queued  # the queue let the most urgent part go first
    assert len(queued) >= 6, spans  # the rest a peer started first (demand), or at submit
    steps = [e for e in doc["traceEvents"] if e.get("ph") == "i" and e["cat"] == "step"]
    assert [e["args"]["step"] for e in steps] == [0, 1], steps
    print(f"rank {team.rank} queued priorities {queued}", flush=True)


def tuning(comm: MPI.Comm) -> None:
    team = Team.from_mpi(comm)
    rank = team.rank
    tuner = AutoTuner(credit=True, partition=True, trials=6, trial_steps=1, warmup_steps=0, period=1,
                      credit_range=(4 << 10, 256 << 10), partition_range=(4 << 10, 64 << 10), seed=3)
    sched = Scheduler(team, partition_bytes=16 << 10, credit_bytes=1 << 20, tuning=tuner, timeout=60)
    n = 64 << 10  # floats: 256 KiB per tensor, 3 tensors
    seen = []
    for step in range(1, 16):
        credit, partition = team.ctx.credit_bytes, sched.partition_bytes
        waits = team.ctx.stats["credit_waits"]
        arrays = [np.full(n, 1.0, np.float32) for _ in range(3)]
        hs = [sched.submit(f"t{i}", a, priority=i) for i, a in enumerate(arrays)]
        for h in hs:
            h.wait(timeout=60)
        assert all(np.all(a == team.size) for a in arrays)
        parts = len(hs[0].requests)
        assert parts == -(-arrays[0].nbytes // partition), (parts, partition)  # partition acts
        held = team.ctx.stats["credit_waits"] - waits
        if credit >= 3 * arrays[0].nbytes:
            assert held == 0, (credit, held)  # credit acts: nothing ever held back
        seen.append((step, credit, partition, parts, held > 0))
        sched.step()
    everyone = comm.allgather([s[:4] for s in seen])  # (whether credit held work back is each rank's timing)
    assert all(s == everyone[0] for s in everyone), everyone  # same settings at the same step
    credits = {c for _, c, _, _, _ in seen}
    partitions = {p for _, _, p, _, _ in seen}
    assert len(credits) >= 2 and len(partitions) >= 2, seen
    if rank == 0:
        assert tuner.state == "tuned" and tuner.best is not None, tuner
        assert (team.ctx.credit_bytes, sched.partition_bytes) == tuner.best, (tuner.best, seen[-1])
        print("tuning log", tuner.log, flush=True)
    print(f"rank {rank} steps {seen}", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    run_rank({"orders": orders, "tuning": tuning, "trace": traced}[mode], MPI.COMM_WORLD, *sys.argv[2:])
