"""Teams: a group of ranks that run collectives together (UCC's team, MPI's communicator).

A team knows its rank and size, the progress engine (:class:`~pycoll.engine.Context`) that runs
its schedules, and the transport that moves its messages. Algorithms reach peers only through the
team's point-to-point methods, never a transport directly.

Messages are keyed by tags the team builds: user point-to-point messages by ``("p", tag)``,
collectives by ``("c", sequence number or user tag, step)``, so concurrent collectives on one team
never match each other's messages.
"""

from __future__ import annotations

import itertools
from typing import Any, Hashable, List, Optional

from pycoll.buffers import as_bytes
from pycoll.engine.context import Context, get_context
from pycoll.tl.base import Transport, TransportRequest
from pycoll.tl.local import LocalFabric


class Team:
    """``size`` ranks running collectives together; this object is rank ``rank``'s end."""

    def __init__(self, rank: int, size: int, transport: Transport, ctx: Optional[Context] = None, *,
                 name: str = "team") -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a team of {size}")
        self.rank = rank
        self.size = size
        self.transport = transport
        self.ctx = ctx if ctx is not None else get_context()
        self.name = name
        self._seq = itertools.count()

    # ------------------------------------------------------------------ point to point
    def isend(self, buf: Any, peer: int, tag: Hashable = 0) -> TransportRequest:
        """Non-blocking send of ``buf`` to team rank ``peer``; ``req.test()`` says when done."""
        return self.transport.isend(as_bytes(buf), self._peer(peer), ("p", tag))

    def irecv(self, buf: Any, peer: int, tag: Hashable = 0) -> TransportRequest:
        """Non-blocking receive into ``buf`` from team rank ``peer``."""
        return self.transport.irecv(as_bytes(buf, writable=True), self._peer(peer), ("p", tag))

    def _peer(self, peer: int) -> int:
        if not 0 <= peer < self.size:
            raise ValueError(f"{self.name}: peer {peer} is not a rank of a team of {self.size}")
        return peer

    def next_sequence(self) -> int:
        """The sequence number of the next untagged collective (matched across ranks by order)."""
        return next(self._seq)

    def __repr__(self) -> str:
        return f"<Team {self.name} rank {self.rank}/{self.size} over {self.transport.name}>"


def local_teams(n: int, ctx: Optional[Context] = None) -> List[Team]:
    """``n`` ranks inside this process, exchanging messages through memory and all run by one
    engine: test algorithms at any size without starting processes."""
    if n < 1:
        raise ValueError(f"local_teams needs n >= 1, got {n}")
    ctx = ctx if ctx is not None else Context()
    fabric = LocalFabric(n)
    return [Team(r, n, fabric.transport(r), ctx, name=f"local{n}") for r in range(n)]
