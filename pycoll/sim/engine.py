"""The discrete-event simulation of a set of programs (one per rank) on a :class:`Machine`.

Each rank runs its program as the executors do: instructions are issued in order, each once
those it depends on are done (a reduction or copy holds the rank until it is done; a send or a
receive only for the ``overhead`` of posting it, and ``overhead_per_byte`` for each byte). A send
books the sender's link out and the receiver's link in for its bytes (after those already booked;
each link is free again ``gap`` after a message started on it at the earliest) and arrives
``alpha`` later; a receive is done when its message has arrived and it was posted (messages
between two ranks match by step, in order). With the machine's ``contention`` a send is a flow
instead, sharing the links it crosses with the others in flight (:mod:`pycoll.sim.flows`): it is
done when drained, and arrives ``alpha`` later. Only sizes travel: no payload. The clock jumps
from one completion to the next (a heap of completion times).

A measured host's model (:class:`Machine`'s ``*_by_size`` tables, ``cpu_copies``,
``together_by_size``, ``call``, ``half_duplex``) changes this: within a node a send is done once
posted and its message is there ``alpha`` later, then copied in by its receiver's core once its
receive is posted and the core is free (a copy that overlaps another core's on the node takes
longer); rates and latencies are the tables' at the message's size; ``CALL`` instructions (a loop
of calls, :func:`pycoll.sim.programs.looped`) hold the rank for ``call``; with ``half_duplex`` a
rank's link out and link in are one link, booked by its sends and receives alike.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from pycoll.lower.program import SIZE_SLICE, Program
from pycoll.sim.flows import Flows
from pycoll.sim.machine import Machine

SEND, RECV, REDUCE, COPY, AVG, CALL = range(6)  # (CALL: a call's start, its rank's time; see programs.looped)
#: Heap entries ``(time, seq, code, i)`` that are not an instruction's completion (those carry the
#: rank, >= 0): rank ``i`` starts (seq ``i``: below every other's), flow ``i`` starts, or may end.
_COPY_STARTS, _RANK_STARTS, _FLOW_STARTS, _FLOW_ENDS = -4, -3, -2, -1
_KINDS = {"send": SEND, "recv": RECV, "reduce": REDUCE, "copy": COPY, "avg": AVG}


def edges_csr(waited: np.ndarray, waiting: np.ndarray, n: int) -> Tuple[array, array]:
    """``(first, dependents)`` of the edges ``waited[k] -> waiting[k]`` (instruction ``waiting[k]``
    waits for ``waited[k]``) among ``n`` instructions: each one's dependents in increasing order."""
    order = np.lexsort((waiting, waited))
    first = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(waited, minlength=n), out=first[1:])
    return array("i", first.tobytes()), array("i", waiting[order].astype(np.int32).tobytes())


@dataclass
class Compact:
    """One rank's program as the simulator reads it, in flat arrays (about 35 bytes an
    instruction: a ring's programs on thousands of ranks hold millions): per instruction its kind,
    peer, step, bytes and the number of instructions it waits for; the instructions that wait for
    instruction ``i`` are ``dependents[first[i]:first[i + 1]]``."""

    kinds: array
    peers: array
    steps: array
    nbytes: array
    ndeps: array
    first: array
    dependents: array

    @classmethod
    def build(cls, kinds: List[int], peers: List[int], steps: List[int], nbytes: List[int],
              deps: List[List[int]]) -> Compact:
        """From per-instruction lists, ``deps[i]`` the instructions ``i`` waits for."""
        n = len(kinds)
        counts = [len(d) for d in deps]
        waited = np.fromiter(itertools.chain.from_iterable(deps), np.int32, count=sum(counts))
        waiting = np.repeat(np.arange(n, dtype=np.int32), counts)
        return cls(array("b", kinds), array("i", peers), array("i", steps), array("q", nbytes),
                   array("i", counts), *edges_csr(waited, waiting, n))

    @classmethod
    def of(cls, program: Program) -> Compact:
        """The compact form of ``program``."""
        s = program.sizes
        if s is not None:
            return cls.build([_KINDS[k] for k in s.kinds], s.peers, s.steps, s.nbytes, s.deps)
        ins = program.instrs
        return cls.build([_KINDS[x.kind] for x in ins], [x.peer for x in ins], [x.step for x in ins],
                         [x.slices[SIZE_SLICE[x.kind]][2] for x in ins], [x.deps for x in ins])

    def deps(self) -> List[List[int]]:
        """What each instruction waits for (lists)."""
        out: List[List[int]] = [[] for _ in self.kinds]
        for i in range(len(self.kinds)):
            for j in self.dependents[self.first[i]:self.first[i + 1]]:
                out[j].append(i)
        return out


@dataclass
class Result:
    """What a simulation found: the collective's time (the last rank's finish), each rank's finish,
    the events processed and the wall time they took."""

    time: float
    finish: List[float]
    events: int
    wall: float
    messages: int = 0
    bytes_sent: int = 0
    unmatched: List[str] = field(default_factory=list)
    #: The ranks that died (``fail``): rank -> the time it died.
    died: Dict[int, float] = field(default_factory=dict)
    #: The survivors a death stopped: rank -> the time their PeerLostError is raised.
    errors: Dict[int, float] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall if self.wall > 0 else math.inf


def run(programs: Sequence[Compact], machine: Machine, start: Optional[Dict[int, float]] = None,
        slow: Optional[Dict[int, float]] = None,
        fail: Optional[Dict[int, Tuple[float, float]]] = None,
        timeline: Optional[List[Tuple[int, int, int, int, float, float]]] = None,
        payload: Any = None, native: bool = True) -> Result:
    """Simulate ``programs`` (rank ``r``'s at index ``r``) on ``machine``. ``start``: ranks that
    start late (rank -> seconds); ``slow``: ranks whose every cost is multiplied (rank -> factor);
    ``fail``: ranks that die (rank -> (the time, the time their peers take to know)): a dead rank
    does nothing from then on and its messages still on their way are lost; a survivor that cannot
    finish raises PeerLostError when it is stuck and knows of a death (``Result.errors``).
    ``timeline``: a list that gets each instruction run, as (rank, kind, peer, bytes, issued, done);
    ``payload``: the data (:class:`pycoll.sim.payload.Payload`), moved and reduced as the
    instructions run. Without contention, deaths, a timeline or a payload the loop runs in C
    (``pycoll._native``: the same events in the same order, so the same times), unless ``native``
    is False or the native module is missing, or the machine has a measured host's model
    (``Machine.by_size``)."""
    wall0 = time.perf_counter()
    if machine.contention and machine.by_size:
        raise ValueError("a machine's *_by_size tables, cpu_copies, together_by_size, call and half_duplex "
                         "model measured hosts' costs; they do not combine with shared links "
                         "(contention)")
    n = len(programs)
    starts = [0.0] * n
    factor = [1.0] * n
    for r, t in (start or {}).items():
        starts[r] = t
    for r, f in (slow or {}).items():
        factor[r] = f
    if native and not fail and timeline is None and payload is None and not machine.contention \
            and not machine.by_size:
        done = _run_native(programs, machine, starts, factor, wall0)
        if done is not None:
            return done
    dies = {r: t for r, (t, _) in (fail or {}).items()}
    known = min((t + d for t, d in (fail or {}).values()), default=math.inf)  # the first death known
    remaining = [list(p.ndeps) for p in programs]
    left = [len(p.kinds) for p in programs]
    finish = list(starts)
    tx_free = [0.0] * n
    rx_free = tx_free if machine.half_duplex else [0.0] * n  # (half duplex: one link both ways)
    cpu_free = list(starts)
    # (receiver, sender, step) -> the messages no receive was posted for yet (arrival, seconds its
    # receiver's core copies it with cpu_copies, bytes), and
    # the receives posted (instruction, when) no message came for yet, in order (emptied: deleted)
    mailbox: Dict[Tuple[int, int, int], List[Tuple[float, float, int]]] = {}
    waiting: Dict[Tuple[int, int, int], List[Tuple[int, float]]] = {}
    heap: List[Tuple[float, int, int, int]] = []
    push = heapq.heappush
    seq = 0
    messages = sent = 0
    o, o_byte, gap = machine.overhead, machine.overhead_per_byte, machine.gap
    link = machine.link
    flat = (machine.alpha, 1.0 / machine.bandwidth) if machine.ppn == 1 else None  # (one link kind: no call)
    rbw, cbw = machine.reduce_bw, machine.copy_bw
    by_size = machine.by_size  # (rates by size, messages holding cores: the calls below)
    message, compute, call = machine.message, machine.compute, machine.call
    ppn = machine.ppn
    cpu_copies = machine.cpu_copies and not machine.contention
    together = bool(machine.together_by_size) and cpu_copies
    copies: Dict[int, List[Tuple[float, float, int]]] = {}  # node -> its copies (start, end, rank)
    copying_in: Dict[int, Tuple[int, int, float, int]] = {}  # entry -> (rank, receive, seconds, bytes)
    clock = -math.inf  # (the time of the event being processed: copies that ended before are dropped)
    rdv_bytes, rdv = machine.rendezvous_bytes, machine.rendezvous

    nxt = [0] * n  # the next instruction each rank issues
    flows = Flows(machine.capacity) if machine.contention else None
    route = machine.route
    #: flow -> (rank, instruction, peer, step, alpha, bytes) of the send it carries
    sending: Dict[int, Tuple[int, int, int, int, float, float]] = {}
    projected: Dict[int, int] = {}  # flow -> the heap entry of its latest projected end

    def copying(r: int, start: float, cost: float, nb: int) -> float:
        """When a copy or reduction of ``nb`` bytes that rank ``r``'s core starts at ``start``
        ends: ``cost`` seconds, longer (the machine's ``together``) where another core of the node
        copies at the same time (their caches and memory are shared)."""
        if not together:
            return start + cost
        live = copies.setdefault(r // ppn, [])
        if live:
            live[:] = [x for x in live if x[1] > clock]
            if any(s2 < start + cost and e2 > start and r2 != r for s2, e2, r2 in live):
                cost *= machine.together(nb)
        live.append((start, start + cost, r))
        return start + cost

    def deliver(d: int, src: int, step: int, arrival: float, copy: float = 0.0, nb: int = 0) -> None:
        """A message from ``src`` to ``d`` arrives at ``arrival``: to its posted receive, or to the
        mailbox until one is posted. ``copy``: the seconds the receiver's core then copies it
        (``cpu_copies``), from when it arrived, the receive was posted and the core is free."""
        nonlocal seq
        key = (d, src, step)
        q = waiting.get(key)
        if q is not None:
            j, posted = q.pop(0)
            if not q:
                del waiting[key]
            seq += 1
            ready = arrival if arrival > posted else posted
            if copy:  # (the core is claimed when the copy starts: see _COPY_STARTS)
                copying_in[seq] = (d, j, copy, nb)
                push(heap, (ready, seq, _COPY_STARTS, seq))
            else:
                push(heap, (ready, seq, d, j))
        elif key in mailbox:
            mailbox[key].append((arrival, copy, nb))
        else:
            mailbox[key] = [(arrival, copy, nb)]

    began: Dict[Tuple[int, int], float] = {}  # (with a timeline) when each instruction was issued
    counts = [len(p.kinds) for p in programs]
    seq = n
    # every rank issues its first instructions before anything else happens, in rank order (at
    # -inf: the entry's time is its start)
    heap.extend((-math.inf, r, _RANK_STARTS, r) for r in range(n))
    events = 0
    pop = heapq.heappop
    while heap or flows is not None and flows.dirty:
        if flows is not None and flows.dirty and (not heap or heap[0][0] > flows.now):
            for end, fid in flows.settle():  # (every start and end of this instant seen: new rates)
                seq += 1
                projected[fid] = seq
                push(heap, (end, seq, _FLOW_ENDS, fid))
            continue
        t, entry, r, i = pop(heap)
        clock = t
        if r == _RANK_STARTS:
            r, t = i, starts[i]
            p = programs[r]
        elif r == _COPY_STARTS:  # a message there for its posted receive: the receiver's core copies it
            d, j, copy, nb = copying_in.pop(i)
            if dies and t > dies.get(d, math.inf):
                continue
            end = copying(d, t if t > cpu_free[d] else cpu_free[d], copy, nb)
            cpu_free[d] = end
            seq += 1
            push(heap, (end, seq, d, j))
            continue
        else:
            if r == _FLOW_STARTS:
                src, _, d, _, _, nb = sending[i]
                flows.start(t, i, nb, route(src, d))  # type: ignore[union-attr]
                continue
            if r == _FLOW_ENDS:
                if projected.get(i) != entry:
                    continue  # (a projection the rates have changed since)
                del projected[i]
                flows.end(t, i)  # type: ignore[union-attr]
                r, i, d, step, alpha, _ = sending.pop(i)
                if t <= dies.get(r, math.inf):
                    deliver(d, r, step, t + alpha)  # (and the send is done: below)
            # instruction i of rank r is done
            if dies and t > dies.get(r, math.inf):
                continue  # (the rank died before this completion: its message, if any, is lost)
            events += 1
            left[r] -= 1
            if t > finish[r]:
                finish[r] = t
            p = programs[r]
            if timeline is not None:
                timeline.append((r, p.kinds[i], p.peers[i], p.nbytes[i], began.pop((r, i)), t))
            if payload is not None:
                payload.done(r, i)
            rem = remaining[r]
            for j in p.dependents[p.first[i]:p.first[i + 1]]:
                rem[j] -= 1
        # issue rank r's next instructions in order while their dependencies are done (inline: this
        # is the loop every event takes)
        if dies and t >= dies.get(r, math.inf):
            continue  # (dead)
        rem = remaining[r]
        i = nxt[r]
        count = counts[r]
        while i < count and rem[i] == 0:
            k = p.kinds[i]
            if timeline is not None:
                began[r, i] = t
            if payload is not None:
                payload.begin(r, i)
            if k == SEND:
                d = p.peers[i]
                nb = p.nbytes[i]
                t0 = (t if t > cpu_free[r] else cpu_free[r]) + (o + nb * o_byte) * factor[r]
                cpu_free[r] = t0
                if by_size:  # (the rendezvous latency in alpha where it applies)
                    alpha, per_byte = message(r, d, nb)
                else:
                    alpha, per_byte = flat if flat is not None else link(r, d)
                    if rdv_bytes and nb >= rdv_bytes:
                        alpha += rdv
                messages += 1
                sent += nb
                seq += 1
                if flows is not None:  # (its rate depends on the others: it starts at t0, ends when drained)
                    sending[seq] = (r, i, d, p.steps[i], alpha, nb * factor[r])
                    push(heap, (t0, seq, _FLOW_STARTS, seq))
                else:
                    b = tx_free[r]
                    if b < t0:
                        b = t0
                    if b < rx_free[d]:
                        b = rx_free[d]
                    if cpu_copies and r // ppn == d // ppn:  # (the receiver's core copies it in once
                        push(heap, (t0, seq, r, i))  # it has its receive: the send is done)
                        if not dies or t0 + alpha <= dies.get(r, math.inf):  # (there before it died)
                            deliver(d, r, p.steps[i], t0 + alpha, nb * per_byte * factor[d], nb)
                    else:
                        end = b + nb * per_byte * factor[r]
                        tx_free[r] = rx_free[d] = end if end > b + gap else b + gap
                        push(heap, (end, seq, r, i))
                        if not dies or end <= dies.get(r, math.inf):
                            deliver(d, r, p.steps[i], end + alpha)
            elif k == RECV:
                t0 = (t if t > cpu_free[r] else cpu_free[r]) + (o + p.nbytes[i] * o_byte) * factor[r]
                cpu_free[r] = t0
                key = (r, p.peers[i], p.steps[i])
                q = mailbox.get(key)
                if q is not None:
                    arrival, copy, nb = q.pop(0)
                    if not q:
                        del mailbox[key]
                    seq += 1
                    ready = arrival if arrival > t0 else t0
                    if copy:  # (the core is claimed when the copy starts)
                        copying_in[seq] = (r, i, copy, nb)
                        push(heap, (ready, seq, _COPY_STARTS, seq))
                    else:
                        push(heap, (ready, seq, r, i))
                elif key in waiting:
                    waiting[key].append((i, t0))
                else:
                    waiting[key] = [(i, t0)]
            else:
                t0 = t if t > cpu_free[r] else cpu_free[r]
                if by_size:
                    cost = call if k == CALL else compute(k == REDUCE, p.nbytes[i])
                else:
                    bw = rbw if k == REDUCE else cbw
                    cost = p.nbytes[i] / bw if bw != math.inf else 0.0
                cost *= factor[r]
                end = copying(r, t0, cost, p.nbytes[i]) if k != CALL else t0 + cost
                cpu_free[r] = end
                seq += 1
                push(heap, (end, seq, r, i))
            i += 1
        nxt[r] = i
    errors = {r: max(finish[r], known) for r in range(n) if left[r] and r not in dies and known < math.inf}
    unmatched = [f"rank {r}: {left[r]} instructions never ran" for r in range(n)
                 if left[r] and r not in dies and r not in errors]
    end = max([finish[r] for r in range(n) if r not in dies] + list(errors.values()), default=0.0)
    return Result(end, finish, events + messages, time.perf_counter() - wall0, messages, sent, unmatched,
                  dies, errors)


def _run_native(programs: Sequence[Compact], machine: Machine, starts: List[float], factor: List[float],
                wall0: float) -> Optional[Result]:
    """:func:`run`'s loop in C (``native/sim.c``), on the programs' arrays laid end to end; None
    where the native module is missing or cannot take them (a step or rank past its key's bits)."""
    try:
        from pycoll._native import ffi, lib  # noqa: PLC0415 - built at install; the Python loop otherwise
    except ImportError:
        return None
    n = len(programs)
    if n == 0:
        return None
    codes = {"kinds": "b", "peers": "i", "steps": "i", "nbytes": "q", "ndeps": "i", "first": "i",
             "dependents": "i"}
    for p in programs:  # (the C loop reads them as these types, kinds' length each, first one more)
        if any(getattr(p, name).typecode != code for name, code in codes.items()):
            return None
        count = len(p.kinds)
        if not len(p.peers) == len(p.steps) == len(p.nbytes) == len(p.ndeps) == count:
            return None
        if len(p.first) != count + 1:
            return None
    ioff, foff, doff = array("q", [0]), array("q", [0]), array("q", [0])
    for p in programs:
        ioff.append(ioff[-1] + len(p.kinds))
        foff.append(foff[-1] + len(p.first))
        doff.append(doff[-1] + len(p.dependents))

    ctype = {"b": "int8_t[]", "i": "int32_t[]", "q": "int64_t[]"}

    def flat(name: str) -> Any:
        """Every program's array ``name``, end to end, as a C array."""
        arrays = [getattr(p, name) for p in programs]
        data = b"".join(a.tobytes() for a in arrays) or bytes(8)
        return ffi.from_buffer(ctype[arrays[0].typecode], data)

    m = ffi.new("pc_sim_machine_t *")
    m.alpha, m.per_byte = machine.alpha, 1.0 / machine.bandwidth
    m.node_alpha, m.node_per_byte = machine.node_alpha, 1.0 / machine.node_bandwidth
    m.overhead, m.reduce_bw, m.copy_bw = machine.overhead, machine.reduce_bw, machine.copy_bw
    m.overhead_per_byte, m.gap = machine.overhead_per_byte, machine.gap
    m.rendezvous, m.rendezvous_bytes, m.ppn = machine.rendezvous, machine.rendezvous_bytes or 0, machine.ppn
    finish = ffi.new("double[]", n)
    left = ffi.new("int64_t[]", n)
    stats = ffi.new("int64_t[3]")
    offsets = [ffi.from_buffer("int64_t[]", a) for a in (ioff, foff, doff)]
    rc = lib.pycoll_sim_run(n, offsets[0], flat("kinds"), flat("peers"), flat("steps"), flat("nbytes"),
                            flat("ndeps"), offsets[1], flat("first"), offsets[2], flat("dependents"), m,
                            ffi.new("double[]", starts), ffi.new("double[]", factor), finish, left, stats)
    if rc != 0:
        return None
    fin, lft = list(finish), list(left)
    unmatched = [f"rank {r}: {lft[r]} instructions never ran" for r in range(n) if lft[r]]
    events, messages, sent = stats[0], stats[1], stats[2]
    return Result(max(fin, default=0.0), fin, events + messages, time.perf_counter() - wall0, messages, sent,
                  unmatched)
