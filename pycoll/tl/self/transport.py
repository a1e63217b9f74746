"""Team-of-one transport: a rank sending to itself (peer 0) goes through an in-process mailbox."""

from __future__ import annotations

from typing import Hashable

import numpy as np

from pycoll.tl.base import Transport, TransportRequest
from pycoll.tl.local.transport import LocalFabric


class SelfTransport(Transport):
    """Loopback for a team of size 1 (the local fabric with one rank)."""

    name = "self"

    def __init__(self) -> None:
        self._local = LocalFabric(1).transport(0)
        self.traffic = self._local.traffic  # what the loopback counts (all under peer 0: itself)

    def isend(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        return self._local.isend(buf, peer, tag)

    def irecv(self, buf: np.ndarray, peer: int, tag: Hashable) -> TransportRequest:
        return self._local.irecv(buf, peer, tag)

    def probe(self, peer: int, tag: Hashable) -> bool:
        return self._local.probe(peer, tag)
