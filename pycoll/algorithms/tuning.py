"""Algorithm selection: a table of rules per collective, and the ``PYCOLL_TUNE`` syntax that
overrides it (in the spirit of UCC's ``UCC_TL_UCP_TUNE``).

A rule says: for this collective, on teams of this many ranks, for messages of this many bytes,
in this kind of memory, use this algorithm. The first rule that matches wins; rules from
``PYCOLL_TUNE`` come before the defaults.

Syntax: entries separated by ``#`` or ``;``; an entry is the collective, then ``:``-separated
fields in any order::

    allreduce:0-4K:rd#allreduce:4K-inf:ring;bcast:0-inf:knomial
    allreduce:team=2-2:0-8M:rd
    allreduce:mem=host:shm

- a byte range ``LO-HI`` (``K``, ``M``, ``G`` suffixes; ``inf``); the message size must satisfy
  LO <= bytes < HI; default ``0-inf``;
- ``team=LO-HI`` (inclusive team sizes, ``inf`` allowed); default any;
- ``mem=host`` or ``mem=cuda``; default any;
- the algorithm's name (exactly one; ``@name`` works too).

A rule naming ``shm`` applies only to untagged calls on a team with a shared segment; one naming
``cma`` only on a team on one host whose ranks may read each other's memory; one naming a
hierarchical algorithm (``rab``, ``split_rail``, ``hier``) only on a team that spans several nodes
with several ranks on some node (it has node and rail sub-teams).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from pycoll.config import parse_bytes
from pycoll.errors import ConfigError

INF = math.inf
#: Algorithms that run on a team's node and rail sub-teams.
HIERARCHICAL = frozenset({"rab", "split_rail", "hier"})


@dataclass(frozen=True)
class Rule:
    """Use ``algorithm`` for ``coll`` when the team size is in ``team`` (inclusive) and the
    message size in ``msg`` (``lo <= bytes < hi``) and the memory is ``mem`` (None: any)."""

    coll: str
    algorithm: str
    msg: Tuple[float, float] = (0, INF)
    team: Tuple[float, float] = (1, INF)
    mem: Optional[str] = None
    source: str = "default"
    #: Only on teams whose single copy (process_vm_readv) measured "fast" or "slow" (see
    #: ``ShmSegment.cma_slow``); None: any.
    cma_speed: Optional[str] = None

    def matches(self, size: int, nbytes: int, mem: str, shared: bool, cma: bool = False,
                hier: bool = False, cma_slow: bool = False) -> bool:
        if (self.algorithm == "shm" and not shared) or (self.algorithm == "cma" and not cma):
            return False
        speed = "" if not cma else "slow" if cma_slow else "fast"
        if self.cma_speed is not None and self.cma_speed != speed:
            return False
        if self.algorithm in HIERARCHICAL and not hier:
            return False
        return (self.team[0] <= size <= self.team[1] and self.msg[0] <= nbytes < self.msg[1]
                and (self.mem is None or self.mem == mem))

    def __str__(self) -> str:
        def size(x: float) -> str:
            return "inf" if x == INF else human_bytes(int(x))

        team = "any" if self.team == (1, INF) else f"{int(self.team[0])}-{size(self.team[1])}"
        msg = f"{size(self.msg[0])}-{size(self.msg[1])}"
        where = ", teams spanning nodes" if self.algorithm in HIERARCHICAL else ""
        where += f", where the single copy is {self.cma_speed}" if self.cma_speed else ""
        return (f"{self.coll:<10} bytes {msg:<9} team {team:<6} mem {self.mem or 'any':<5} -> "
                f"{self.algorithm} ({self.source}{where})")


def human_bytes(n: int) -> str:
    """A byte count as the selection table writes it: 4K, 1M, 2G, or plain bytes."""
    for unit, suffix in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


_RANGE = re.compile(r"^([0-9.]+[A-Za-z]*|inf)-([0-9.]+[A-Za-z]*|inf)$")


def _bound(text: str) -> float:
    return INF if text.lower() in ("inf", "infinity") else parse_bytes(text)


def parse(text: str, known: Dict[str, Iterable[str]]) -> List[Rule]:
    """The rules of a ``PYCOLL_TUNE`` string; ``known`` maps collectives to their algorithms.
    Raises :class:`pycoll.ConfigError` naming the bad token and where it is."""
    rules: List[Rule] = []
    if not text or not text.strip():
        return rules
    pos = 0
    for entry in re.split(r"[#;]", text):
        start = text.find(entry, pos)
        pos = start + len(entry)
        entry = entry.strip()
        if not entry:
            continue

        def bad(token: str, why: str, entry: str = entry, start: int = start) -> ConfigError:
            at = text.find(token, start)
            return ConfigError(f"PYCOLL_TUNE: {why}: {token!r} in entry {entry!r} (at character {at}); "
                               "expected e.g. allreduce:0-4K:rd#allreduce:4K-inf:ring")

        coll, *fields = [f.strip() for f in entry.split(":")]
        if coll not in known:
            raise bad(coll, f"unknown collective (known: {', '.join(known)})")
        msg, team, mem, alg = (0.0, INF), (1.0, INF), None, None
        for field in fields:
            if not field:
                raise bad(entry, "empty field")
            low = field.lower()
            if low.startswith("team="):
                m = _RANGE.match(field[5:])
                if not m:
                    raise bad(field, "team sizes must be LO-HI")
                lo, hi = (INF if g.lower() == "inf" else float(g) for g in m.groups())
                if lo < 1 or hi < lo:
                    raise bad(field, "empty team size range")
                team = (lo, hi)
            elif low.startswith("mem="):
                if low[4:] not in ("host", "cuda"):
                    raise bad(field, "memory must be host or cuda")
                mem = low[4:]
            elif _RANGE.match(field):
                lo_t, hi_t = _RANGE.match(field).groups()
                try:
                    lo, hi = _bound(lo_t), _bound(hi_t)
                except ConfigError:
                    raise bad(field, "bad byte range") from None
                if hi <= lo:
                    raise bad(field, "empty byte range")
                msg = (lo, hi)
            else:
                name = field[1:] if field.startswith("@") else field
                if name not in known[coll]:
                    raise bad(field, f"unknown {coll} algorithm (known: {', '.join(known[coll])})")
                if alg is not None:
                    raise bad(field, "a second algorithm")
                alg = name
        if alg is None:
            raise bad(entry, "no algorithm")
        rules.append(Rule(coll, alg, msg, team, mem, source="PYCOLL_TUNE"))
    return rules


def choose(rules: Sequence[Rule], coll: str, size: int, nbytes: int, mem: str = "host",
           shared: bool = False, cma: bool = False, hier: bool = False,
           cma_slow: bool = False) -> Optional[str]:
    """The algorithm of the first rule that matches, or None."""
    for rule in rules:
        if rule.coll == coll and rule.matches(size, nbytes, mem, shared, cma, hier, cma_slow):
            return rule.algorithm
    return None
