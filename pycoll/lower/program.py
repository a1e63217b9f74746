"""The program form of one rank's collective: numbered instructions over named buffers.

A program is what a schedule of point-to-point primitives lowers to (:mod:`pycoll.lower.record`):
a flat list of instructions, each one of

- ``send`` / ``recv``: a slice of a buffer to or from ``peer``, on message step ``step`` of the
  collective's key (the step numbers the algorithm's channel used);
- ``reduce``: ``out = a (op) b`` elementwise over ``dtype`` (AVG reduces as SUM);
- ``copy``: ``dst = src`` (same length);
- ``avg``: divide ``buf`` (of ``dtype``) by ``n`` in place (AVG's last step);

with ``deps``, the numbers of the instructions it must wait for (always earlier ones: a program
is in an order that runs). A slice is ``[buffer, offset, nbytes]``; buffers are ``src`` and
``dst`` (the caller's, as many bytes as the call's) and scratch buffers whose sizes the program
states (allocated once when it is loaded into a task).

Its JSON form is what ``pycoll lower`` prints and :func:`loads` reads back; :func:`check` (run by
:func:`loads`) rejects a program with a slice out of bounds, a dependency that is not an earlier
instruction, or an unknown kind, op or dtype, and :func:`check_set` a set of programs (one per
rank) with a receive no send matches, before anything is sent.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pycoll.dtypes import DTYPES
from pycoll.errors import PycollError
from pycoll.ops import ReduceOp, check_op

FORMAT = "pycoll-program"
#: The largest step number (message steps of one collective between two ranks; UCX carries 12 bits).
MAX_STEP = 4095
VERSION = 1
KINDS = ("send", "recv", "reduce", "copy", "avg")
#: The slices each kind names, in its JSON fields.
SLICES = {"send": ("buf",), "recv": ("buf",), "reduce": ("a", "b", "out"), "copy": ("src", "dst"),
          "avg": ("buf",)}
OPS = ("sum", "avg", "prod", "min", "max", "band", "bor", "bxor", "land", "lor", "lxor")

Slice = Tuple[str, int, int]  # (buffer, offset, nbytes)


class ProgramError(PycollError, ValueError):
    """A program that cannot run: malformed, out of bounds, cyclic, or (in a set) unmatched."""


@dataclass(slots=True)  # (thousands of ranks record millions of them: slots make each cheaper)
class Instr:
    """One instruction (see the module doc); ``slices`` by field name."""

    kind: str
    slices: Dict[str, Slice]
    deps: List[int] = field(default_factory=list)
    peer: int = -1
    step: int = 0
    op: str = ""
    dtype: str = ""
    n: int = 0

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"kind": self.kind}
        if self.kind in ("send", "recv"):
            out.update(peer=self.peer, step=self.step)
        if self.kind == "reduce":
            out.update(op=self.op)
        if self.kind in ("reduce", "avg"):
            out.update(dtype=self.dtype)
        if self.kind == "avg":
            out.update(n=self.n)
        for name, s in self.slices.items():
            out[name] = list(s)
        out["deps"] = list(self.deps)
        return out


#: The slice whose size is an instruction's bytes, as a simulation reads it.
SIZE_SLICE = {"send": "buf", "recv": "buf", "reduce": "out", "copy": "dst", "avg": "buf"}


@dataclass
class Sizes:
    """A program's instructions as a simulation reads them, in lists side by side: each one's kind,
    peer (-1: a computation), step, bytes (of its :data:`SIZE_SLICE`) and the instructions it waits
    for. What a recording of sizes alone gives (``record(..., sizes_only=True)``): no buffers, so it cannot
    run, but a thousand ranks' programs are recorded without making millions of :class:`Instr`."""

    kinds: List[str] = field(default_factory=list)
    peers: List[int] = field(default_factory=list)
    steps: List[int] = field(default_factory=list)
    nbytes: List[int] = field(default_factory=list)
    deps: List[List[int]] = field(default_factory=list)


@dataclass
class Program:
    """One rank's program for one call shape."""

    coll: str
    algorithm: str
    rank: int
    size: int
    count: int
    dtype: str
    op: str
    root: int
    in_place: bool
    buffers: Dict[str, int]
    instrs: List[Instr]
    #: The v-collectives: the blocks (displacement, count) in elements of the call's counted buffer
    #: (``rlayout``: alltoallv's receive buffer) the program was made for; None for the others.
    layout: Optional[List[Tuple[int, int]]] = None
    rlayout: Optional[List[Tuple[int, int]]] = None
    #: A recording of sizes alone: its instructions are here, not in :attr:`instrs`.
    sizes: Optional[Sizes] = None

    def to_json(self) -> Dict[str, Any]:
        d = {"format": FORMAT, "version": VERSION, "coll": self.coll, "algorithm": self.algorithm,
             "rank": self.rank, "size": self.size, "count": self.count, "dtype": self.dtype,
             "op": self.op, "root": self.root, "in_place": self.in_place, "buffers": dict(self.buffers)}
        for name in ("layout", "rlayout"):
            blocks = getattr(self, name)
            if blocks is not None:
                d[name] = [list(b) for b in blocks]
        d["instructions"] = [i.to_json() for i in self.instrs]
        return d

    def dumps(self) -> str:
        """The JSON text of this program: one line per instruction."""
        d = self.to_json()
        body = ",\n  ".join(json.dumps(i) for i in d.pop("instructions"))
        head = json.dumps(d, indent=1)[:-2]  # (without the closing "\n}")
        return head + ',\n "instructions": [' + (f"\n  {body}\n ]" if body else "]") + "\n}"

    def counts(self) -> Counter:
        """How many instructions of each kind."""
        return Counter(i.kind for i in self.instrs)


def _field(d: Dict[str, Any], name: str, kind: type, where: str) -> Any:
    if name not in d:
        raise ProgramError(f"{where}: no {name!r}")
    value = d[name]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ProgramError(f"{where}: {name!r} must be an integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise ProgramError(f"{where}: {name!r} must be {kind.__name__}, got {value!r}")
    return value


def _blocks(d: Dict[str, Any], name: str) -> Optional[List[Tuple[int, int]]]:
    """A v-collective program's ``layout`` or ``rlayout``: [[displacement, count], ...] or absent."""
    if d.get(name) is None:
        return None
    raw = _field(d, name, list, "program")
    if not all(isinstance(b, list) and len(b) == 2 and all(type(v) is int and v >= 0 for v in b)
               for b in raw):
        raise ProgramError(f"program: {name!r} must be [[displacement, count], ...] of integers >= 0")
    return [(b[0], b[1]) for b in raw]


def from_json(d: Any) -> Program:
    """The program of a JSON object (as :meth:`Program.to_json` writes), checked."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ProgramError(f"not a pycoll program (its 'format' must be {FORMAT!r})")
    if d.get("version") != VERSION:
        raise ProgramError(f"program version {d.get('version')!r}; this pycoll reads {VERSION}")
    buffers = _field(d, "buffers", dict, "program")
    for name, nbytes in buffers.items():
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ProgramError(f"program: buffer {name!r} has a size of {nbytes!r}")
    instrs = []
    for n, raw in enumerate(_field(d, "instructions", list, "program")):
        where = f"instruction {n}"
        if not isinstance(raw, dict):
            raise ProgramError(f"{where}: not an object")
        kind = _field(raw, "kind", str, where)
        if kind not in KINDS:
            raise ProgramError(f"{where}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
        slices = {}
        for name in SLICES[kind]:
            s = _field(raw, name, list, where)
            if len(s) != 3 or not isinstance(s[0], str) or not all(isinstance(v, int) for v in s[1:]):
                raise ProgramError(f"{where}: {name!r} must be [buffer, offset, nbytes], got {s!r}")
            slices[name] = (s[0], s[1], s[2])
        deps = _field(raw, "deps", list, where)
        ins = Instr(kind, slices, deps)
        if kind in ("send", "recv"):
            ins.peer, ins.step = _field(raw, "peer", int, where), _field(raw, "step", int, where)
        if kind == "reduce":
            ins.op = _field(raw, "op", str, where)
        if kind in ("reduce", "avg"):
            ins.dtype = _field(raw, "dtype", str, where)
        if kind == "avg":
            ins.n = _field(raw, "n", int, where)
        instrs.append(ins)
    prog = Program(_field(d, "coll", str, "program"), str(d.get("algorithm", "")),
                   _field(d, "rank", int, "program"),
                   _field(d, "size", int, "program"), _field(d, "count", int, "program"),
                   _field(d, "dtype", str, "program"), _field(d, "op", str, "program"),
                   _field(d, "root", int, "program"), bool(d.get("in_place", False)), buffers, instrs,
                   _blocks(d, "layout"), _blocks(d, "rlayout"))
    check(prog)
    return prog


def loads(text: str) -> Program:
    """Read a program from its JSON text (checked: see :func:`check`)."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProgramError(f"not JSON: {exc}") from None
    return from_json(d)


def check(prog: Program) -> None:
    """Raise :class:`ProgramError` unless every slice lies in its buffer, every dependency is an
    earlier instruction (so there is no cycle), peers are ranks of the team other than this one,
    and ops and dtypes are known."""
    if not 0 <= prog.rank < prog.size:
        raise ProgramError(f"program: rank {prog.rank} is not a rank of a team of {prog.size}")
    names = DTYPES
    for n, ins in enumerate(prog.instrs):
        where = f"instruction {n} ({ins.kind})"
        for d in ins.deps:
            if not isinstance(d, int) or not 0 <= d < n:
                raise ProgramError(f"{where}: depends on {d!r}, which is not an earlier instruction "
                                   "(a dependency must come first: programs have no cycles)")
        for name, (buf, off, nbytes) in ins.slices.items():
            size = prog.buffers.get(buf)
            if size is None:
                raise ProgramError(f"{where}: {name} names buffer {buf!r}, which the program does not have")
            if off < 0 or nbytes < 0 or off + nbytes > size:
                raise ProgramError(f"{where}: {name} [{buf}, {off}, {nbytes}] lies outside {buf!r} "
                                   f"({size} B)")
        if ins.kind in ("send", "recv"):
            if not 0 <= ins.peer < prog.size or ins.peer == prog.rank:
                raise ProgramError(f"{where}: peer {ins.peer} is not another rank of a team of {prog.size}")
            if not 0 <= ins.step <= MAX_STEP:
                raise ProgramError(f"{where}: step {ins.step} is not in 0..{MAX_STEP}")
        if ins.kind == "reduce" and ins.op not in OPS:
            raise ProgramError(f"{where}: unknown op {ins.op!r}")
        if ins.kind in ("reduce", "avg") and ins.dtype not in names:
            raise ProgramError(f"{where}: unknown dtype {ins.dtype!r}")
        if ins.kind == "reduce":
            if len({s[2] for s in ins.slices.values()}) != 1:
                raise ProgramError(f"{where}: a, b and out must have the same length")
            try:
                check_op(ReduceOp[ins.op.upper()], names[ins.dtype])
            except (TypeError, ValueError) as exc:
                raise ProgramError(f"{where}: {exc}") from None
        if ins.kind in ("reduce", "avg") and any(s[2] % names[ins.dtype].itemsize
                                                 for s in ins.slices.values()):
            raise ProgramError(f"{where}: a length that is not a whole number of {ins.dtype} elements")
        if ins.kind == "avg" and ins.n < 1:
            raise ProgramError(f"{where}: divides by {ins.n}")
        if ins.kind == "copy" and ins.slices["src"][2] != ins.slices["dst"][2]:
            raise ProgramError(f"{where}: src and dst must have the same length")


def check_set(programs: Sequence[Program]) -> None:
    """Raise :class:`ProgramError` unless ``programs`` are one per rank of one team, each valid,
    and every receive is matched by a send of exactly its length on its peer, in the same order
    (messages between two ranks on one step match in order, as MPI's do)."""
    size = len(programs)
    for r, p in enumerate(programs):
        if p.rank != r or p.size != size:
            raise ProgramError(f"programs[{r}] is rank {p.rank} of {p.size}; expected rank {r} of {size}")
        check(p)
    sends: Dict[Tuple[int, int, int], List[Tuple[int, int]]] = {}
    recvs: Dict[Tuple[int, int, int], List[Tuple[int, int]]] = {}
    for p in programs:
        for n, ins in enumerate(p.instrs):
            if ins.kind == "send":
                sends.setdefault((p.rank, ins.peer, ins.step), []).append((n, ins.slices["buf"][2]))
            elif ins.kind == "recv":
                recvs.setdefault((ins.peer, p.rank, ins.step), []).append((n, ins.slices["buf"][2]))
    for key in sorted(set(sends) | set(recvs)):
        src, dst, step = key
        s, r = sends.get(key, []), recvs.get(key, [])
        for i in range(max(len(s), len(r))):
            if i >= len(s):
                raise ProgramError(f"rank {dst}'s instruction {r[i][0]} receives from rank {src} on step "
                                   f"{step}, and rank {src} sends nothing more to it on that step")
            if i >= len(r):
                raise ProgramError(f"rank {src}'s instruction {s[i][0]} sends to rank {dst} on step "
                                   f"{step}, and rank {dst} receives nothing more from it on that step")
            if s[i][1] != r[i][1]:
                raise ProgramError(f"rank {src}'s instruction {s[i][0]} sends {s[i][1]} B to rank {dst} on "
                                   f"step {step}; its receive (instruction {r[i][0]}) takes {r[i][1]} B")
