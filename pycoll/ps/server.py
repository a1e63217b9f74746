"""The summation server loop: what a server process runs instead of the user's command.

``pycoll run -n N --servers K -- CMD`` starts the K servers as ``python -m pycoll.ps.server``; under a
plain ``mpiexec`` with ``PYCOLL_NUM_SERVERS=K`` the last K ranks enter this loop when the program
makes its team (``Team.from_mpi(MPI.COMM_WORLD)``) and exit when it ends. A server learns each
tensor from a declaration that worker 0 sends with its first push-pull (name, size, dtype,
partition size, op: every rank derives the same placement from them), then runs rounds of
:func:`pycoll.algorithms.push_pull.service_round` for the parts it owns, one after the other, until
every worker has said goodbye. Control messages are JSON of fixed fields, each checked when read
(:func:`parse_control`): never a pickle, so that no bytes from a peer run as code.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

import numpy as np

from pycoll.algorithms.push_pull import AsyncService, Roles, service_round
from pycoll.dtypes import as_dtype
from pycoll.engine.context import Backoff
from pycoll.errors import PycollError
from pycoll.ops import ReduceOp
from pycoll.ps.placement import plan
from pycoll.tasks.p2p import AnySourceRecvTask
from pycoll.tasks.schedule import Schedule

#: Tag and size of control messages (declarations, goodbyes) from workers to servers.
CONTROL = ("pycoll-pp", "control")
CONTROL_BYTES = 1024
#: The fields of each kind of control message and their types.
_FIELDS: Dict[str, Dict[str, type]] = {
    "decl": {"kind": str, "name": str, "count": int, "dtype": str, "partition_bytes": int, "op": str,
             "mode": str},
    "bye": {"kind": str, "worker": int},
}


def control_message(**fields: Any) -> np.ndarray:
    """A fixed-size control message (its fields as JSON, length-prefixed)."""
    body = json.dumps(fields).encode()
    if len(body) > CONTROL_BYTES - 4:
        raise ValueError(f"push_pull: control message too large ({len(body)} B; a tensor name that long?)")
    buf = np.zeros(CONTROL_BYTES, np.uint8)
    buf[:4] = np.frombuffer(len(body).to_bytes(4, "little"), np.uint8)
    buf[4:4 + len(body)] = np.frombuffer(body, np.uint8)
    return buf


def parse_control(buf: np.ndarray) -> Dict[str, Any]:
    """The fields of a control message; PycollError for anything but a well-formed one."""
    n = int.from_bytes(buf[:4].tobytes(), "little")
    if not 0 < n <= CONTROL_BYTES - 4:
        raise PycollError(f"push_pull server: bad control message length {n}")
    try:
        fields = json.loads(buf[4:4 + n].tobytes().decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise PycollError("push_pull server: a control message that is not JSON") from None
    kind = fields.get("kind") if isinstance(fields, dict) else None
    want = _FIELDS.get(kind) if isinstance(kind, str) else None
    if want is None or set(fields) != set(want) or not all(type(fields[k]) is t for k, t in want.items()):
        raise PycollError(f"push_pull server: bad control message {str(fields)[:200]}")
    if kind == "bye" and fields["worker"] < 0:
        raise PycollError(f"push_pull server: a goodbye of worker {fields['worker']}")
    if kind == "decl":
        try:
            as_dtype(fields["dtype"])
            ok = bool(fields["name"]) and fields["op"] in ReduceOp.__members__ and fields["count"] >= 0
        except ValueError:
            ok = False
        if not ok or fields["partition_bytes"] <= 0 or fields["mode"] not in ("sync", "async"):
            raise PycollError(f"push_pull server: bad declaration {str(fields)[:200]}")
    return fields


def goodbye(world: Any, n: int, k: int, me: int) -> None:
    """Worker ``me`` tells every server it is done (blocking until the messages are sent)."""
    reqs = [world.isend(control_message(kind="bye", worker=me), n + s, CONTROL) for s in range(k)]
    for req in reqs:
        req.wait()


class _Tensor:
    """The parts of one declared tensor that this server sums, and its current round."""

    def __init__(self, roles: Roles, me: int, decl: Dict[str, Any]) -> None:
        self.roles, self.decl = roles, decl
        self.name = decl["name"]
        self.dtype = as_dtype(decl["dtype"])
        self.op = ReduceOp[decl["op"]]
        parts = plan(self.name, decl["count"], self.dtype.itemsize, roles.n, roles.k, decl["partition_bytes"])
        self.parts = [p for p in parts if p.service.server and p.service.index == me]
        self.out = {p.key: np.empty(p.hi - p.lo, self.dtype) for p in self.parts}
        self.request: Any = None
        self.rounds = 0
        self.service: Any = None
        if decl.get("mode") == "async" and self.parts:
            self.service = AsyncService(roles, self.name, self.parts, self.dtype, None)
            self.service.start()

    def start_round(self) -> None:
        sched = Schedule(name=f"serve:{self.name}#{self.rounds}")
        for part in self.parts:
            service_round(self.roles, self.name, part, self.out[part.key], None, None, sched, self.op)
        self.request = self.roles.world.ctx.submit(sched)
        self.rounds += 1


def serve(world: Any, n: int, k: int, me: int, timeout: Optional[float] = None) -> Dict[str, int]:
    """Run server ``me`` (of ``k``) for ``n`` workers on team ``world`` (workers are world ranks
    ``0..n-1``) until every worker said goodbye; returns rounds served per tensor."""
    roles = Roles(world, n, k)
    ctx = world.ctx
    tensors: Dict[str, _Tensor] = {}
    byes: set = set()
    ctl_buf = np.zeros(CONTROL_BYTES, np.uint8)

    def post_control() -> Any:
        return ctx.submit(AnySourceRecvTask(world, ctl_buf, CONTROL, name=f"server{me}:control"))

    ctl = post_control()
    backoff = Backoff(*ctx.backoff)
    while len(byes) < n:
        moved = ctx.progress()
        if ctl.done:
            ctl.wait()
            msg = parse_control(ctl_buf)
            if msg["kind"] == "decl":
                old = tensors.get(msg["name"])
                if old is None or old.decl != msg:
                    if old is not None and old.request is not None and not old.request.done:
                        raise PycollError(f"push_pull server {me}: {msg['name']!r} redeclared mid-round")
                    tensors[msg["name"]] = t = _Tensor(roles, me, msg)
                    if t.parts and t.service is None:
                        t.start_round()
            elif msg["kind"] == "bye":
                byes.add(msg["worker"])
            ctl = post_control()
            moved += 1
        for t in tensors.values():
            if t.request is not None and t.request.done:
                t.request.wait()  # raises a failed round's error
                t.start_round()
                moved += 1
        if moved:
            backoff.reset()
        else:
            backoff.idle()
    ctl.cancel()
    for t in tensors.values():  # rounds and async exchanges nobody pushes to any more
        if t.request is not None and not t.request.done:
            t.request.cancel()
        if t.service is not None:
            t.service.stop()
    return {name: t.service.served if t.service is not None else t.rounds - 1
            for name, t in tensors.items()}


def main() -> None:
    """``python -m pycoll.ps.server``: a server rank of ``pycoll run --servers K``."""
    from mpi4py import MPI  # noqa: PLC0415 - importing mpi4py.MPI initialises MPI

    from pycoll.team import Team  # noqa: PLC0415 - a command line entry; the team imports this module

    Team.from_mpi(MPI.COMM_WORLD)  # a server rank serves inside, then exits
    raise SystemExit("pycoll.ps.server: this rank is not a server (PYCOLL_NUM_SERVERS unset?)")


if __name__ == "__main__":
    main()


__all__ = ["CONTROL", "control_message", "goodbye", "parse_control", "serve"]
