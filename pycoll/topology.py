"""Which ranks of a team share a node, and the sub-teams hierarchical algorithms run on.

Every process names its node with a *node key*: its hostname, unless the settings pretend
otherwise so that one machine can act as several nodes in tests and benchmarks:

- ``PYCOLL_NODE_ID=name``: this process is on node ``name`` (set it per process, e.g. one value
  per network namespace);
- ``PYCOLL_RANKS_PER_NODE=k`` (or ``a,b,c``): the launcher's ranks are grouped ``k`` per node in
  rank order (or ``a`` ranks on the first node, ``b`` on the second, ...). The launcher's rank
  is read from ``PMI_RANK``/``OMPI_COMM_WORLD_RANK``/``RANK``; in-process teams use the team rank.

A team exchanges node keys when it is made (its bootstrap) and numbers its nodes in order of
their lowest rank. A team that spans several nodes, one of them with several ranks, makes its
sub-teams then (UCC's hierarchical team): the **node team** (the ranks of its node) and the **rail
team** (the ranks with its local index on every node); the rail of local index 0 is the
**leaders team**.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from pycoll import config
from pycoll.errors import ConfigError


def launcher_rank() -> Optional[int]:
    """This process's rank as its launcher numbered it (mpiexec, torchrun), if any."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"):
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def pretend_node(rank: int, counts: Sequence[int]) -> int:
    """The node of launcher rank ``rank`` under ``PYCOLL_RANKS_PER_NODE`` counts: ``k`` ranks per
    node, or the listed counts (ranks past their sum go on one more node each ``counts[-1]``)."""
    if len(counts) == 1:
        return rank // counts[0]
    end = 0
    for node, count in enumerate(counts):
        end += count
        if rank < end:
            return node
    return len(counts) + (rank - end) // counts[-1]


def node_key(rank: Optional[int] = None) -> str:
    """The name of this process's node (``rank``: the rank to group by when there is no launcher
    rank, as for in-process teams)."""
    node_id = config.get("PYCOLL_NODE_ID")
    if node_id:
        return f"id:{node_id}"
    host = socket.gethostname()
    counts = config.get("PYCOLL_RANKS_PER_NODE")
    if counts:
        who = rank if rank is not None else launcher_rank()
        if who is None:
            raise ConfigError("PYCOLL_RANKS_PER_NODE needs a launcher rank (PMI_RANK or RANK); use "
                              "PYCOLL_NODE_ID per process instead")
        return f"{host}#{pretend_node(who, counts)}"
    return host


@dataclass(frozen=True)
class Topology:
    """The node of every rank of a team: ``nodes[r]`` (nodes numbered by their lowest rank)."""

    nodes: Tuple[int, ...]

    @classmethod
    def from_keys(cls, keys: Sequence[str]) -> Topology:
        index: dict = {}
        return cls(tuple(index.setdefault(k, len(index)) for k in keys))

    @property
    def n_nodes(self) -> int:
        return max(self.nodes) + 1 if self.nodes else 0

    def members(self, node: int) -> List[int]:
        """Team ranks on ``node``, in rank order."""
        return [r for r, n in enumerate(self.nodes) if n == node]

    def local_rank(self, rank: int) -> int:
        """``rank``'s index among the ranks of its node."""
        node = self.nodes[rank]
        return sum(1 for n in self.nodes[:rank] if n == node)

    def rail(self, index: int) -> List[int]:
        """The ranks with local index ``index`` on their node (one per node that has that many)."""
        return [r for r in range(len(self.nodes)) if self.local_rank(r) == index]

    @property
    def leaders(self) -> List[int]:
        """The lowest rank of every node (node order)."""
        return self.rail(0)

    @property
    def ppn(self) -> List[int]:
        """Ranks per node, in node order."""
        counts = [0] * self.n_nodes
        for n in self.nodes:
            counts[n] += 1
        return counts

    @property
    def hierarchical(self) -> bool:
        """Whether the team spans several nodes and some node holds several of its ranks (then
        the team has node and rail sub-teams)."""
        return self.n_nodes > 1 and self.n_nodes < len(self.nodes)

    def __str__(self) -> str:
        return f"{self.n_nodes} node(s), ranks per node {self.ppn}"


class Levels:
    """A team's sub-teams: ``node`` (this rank's node) and ``rail`` (the ranks with its local
    index on every node), made by the bootstrap when the team spans nodes with several ranks on
    some node; ``alone`` (a team of this rank only), made when first needed."""

    __slots__ = ("node", "rail", "alone")

    def __init__(self) -> None:
        self.node: Optional[Any] = None
        self.rail: Optional[Any] = None
        self.alone: Optional[Any] = None

    def all(self) -> List[Any]:
        """The sub-teams made so far."""
        return [t for t in (self.node, self.rail, self.alone) if t is not None]
