"""Built-in point-to-point tasks: send or receive one buffer to or from a team peer.

``team`` is a :class:`pycoll.Team` (the tasks post on its raw point to point, :attr:`Team.p2p
<pycoll.team.Team.p2p>`) or a transport's :class:`~pycoll.tl.base.Channel` (an algorithm's, whose
messages are keyed by its collective)."""

from __future__ import annotations

import warnings
from typing import Any, Hashable, Optional

import numpy as np

from pycoll.buffers import as_bytes
from pycoll.tasks.task import Task

_NOTHING = np.empty(0, np.uint8)  # what an unbound task points at (see Task.unbind)


def raw_inside_task(team: Any, call: str, wire: Any, peer: int, tag: Hashable) -> Any:
    """``team.isend``/``team.irecv`` called inside the engine (a task's ``post``/``progress``): the
    raw transport request those calls returned before 0.2 (an engine Request there would run the
    engine from within itself), with a DeprecationWarning: tasks post on ``team.p2p``."""
    warnings.warn(f"team.{call} inside a task returns an engine Request from pycoll 0.2: a task posts "
                  f"raw messages with team.p2p.{call}(wire, peer, tag)", DeprecationWarning, stacklevel=3)
    return getattr(team.p2p, call)(wire, peer, tag)


def endpoint(team: Any) -> Any:
    """What a task posts on: a team's raw point to point (its ``p2p`` channel), or ``team`` itself
    (a channel)."""
    return getattr(team, "p2p", team)


class SendTask(Task):
    """Sends ``buf`` to team rank ``peer`` with ``tag``; completes when the send completed locally.

    Takes no credit of its own: the collective it belongs to does (set ``credit`` to change it).
    """

    __slots__ = ("team", "buf", "peer", "tag", "req")
    takes_credit = False

    def __init__(self, team: Any, buf: Any, peer: int, tag: Hashable, *, name: Optional[str] = None,
                 priority: Optional[int] = None) -> None:
        self.buf = as_bytes(buf)
        super().__init__(name or "send", priority=priority, nbytes=self.buf.nbytes)
        self.team = endpoint(team)
        self.peer = peer
        self.tag = tag
        self.req = None

    def post(self) -> None:
        self.req = self.team.isend(self.buf, self.peer, self.tag)
        if self.req.test():
            self.complete()

    def progress(self) -> None:
        if self.req.test():
            self.complete()

    def on_cancel(self) -> None:
        if self.req is not None:
            self.req.cancel()

    def unbind(self) -> None:
        self.buf, self.req = _NOTHING, None

    def describe(self) -> str:
        return f"{self.name}: send of {self.buf.nbytes} B to rank {self.peer} (tag {self.tag!r})"


class RecvTask(Task):
    """Receives into ``buf`` from team rank ``peer`` with ``tag``. Takes no credit."""

    __slots__ = ("team", "buf", "peer", "tag", "req", "source")
    takes_credit = False

    def __init__(self, team: Any, buf: Any, peer: int, tag: Hashable, *, name: Optional[str] = None,
                 priority: Optional[int] = None) -> None:
        self.buf = as_bytes(buf, writable=True)
        super().__init__(name or "recv", priority=priority, nbytes=self.buf.nbytes)
        self.team = endpoint(team)
        self.peer = peer
        self.source = peer
        self.tag = tag
        self.req = None

    def post(self) -> None:
        self.req = self.team.irecv(self.buf, self.peer, self.tag)
        if self.req.test():
            self.complete()

    def progress(self) -> None:
        if self.req.test():
            self.complete()

    def on_cancel(self) -> None:
        if self.req is not None:
            self.req.cancel()

    def unbind(self) -> None:
        self.buf, self.req = _NOTHING, None

    def describe(self) -> str:
        return f"{self.name}: receive of {self.buf.nbytes} B from rank {self.peer} (tag {self.tag!r})"


class AnySourceRecvTask(RecvTask):
    """Receives into ``buf`` the first message with ``tag`` from any peer (MPI_ANY_SOURCE): probes
    the peers in turn (from the next rank on) each time it is progressed, then receives from the
    first one found, whose rank it keeps in :attr:`source`. Takes no credit."""

    __slots__ = ()

    def __init__(self, team: Any, buf: Any, tag: Hashable, *, name: Optional[str] = None,
                 priority: Optional[int] = None) -> None:
        super().__init__(team, buf, None, tag, name=name or "recv(any)", priority=priority)
        self.team = team  # (a Team: it probes the peers, then receives on team.p2p)

    def post(self) -> None:
        self.progress()

    def progress(self) -> None:
        if self.req is None:
            team = self.team
            n = team.size
            for i in range(1, n + 1):
                peer = (team.rank + i) % n
                if team.probe(peer, self.tag):
                    self.peer = self.source = peer
                    self.req = team.p2p.irecv(self.buf, peer, self.tag)
                    break
            else:
                return
        if self.req.test():
            self.complete()

    def describe(self) -> str:
        where = "any rank" if self.source is None else f"rank {self.source}"
        return f"{self.name}: receive of {self.buf.nbytes} B from {where} (tag {self.tag!r})"
