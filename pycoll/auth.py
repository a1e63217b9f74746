"""Job keys and MACs: how a job's ranks know that what they read was written by one of them.

A job has a secret only its ranks know: ``PYCOLL_JOB_KEY`` (``pycoll run`` makes one per job and
hands it to its ranks in their environment), or, for a team made from an MPI communicator, a key
rank 0 draws and sends over MPI. Every team has a random id, drawn by its rank 0 when it is made
(sent over MPI with the key, or with rank 0's value of the team's first exchange through a store).
What pycoll reads back from the store, from a peer's bootstrap exchange or from a TCP hello carries
a MAC (:class:`Seal`): HMAC-SHA256 with the key over the team id, the entry's name, the writer's
rank and the content. An entry of another team, under another name or of another rank does not
pass, so neither a forged entry nor a replayed one is acted on: it is logged and refused
(:class:`pycoll.AuthError`). With a key, a team's store entries also lie under names derived from
the key (:func:`space`): a process without it cannot even find them.

Without a key (a team made from a store, such as torchrun's, with ``PYCOLL_JOB_KEY`` unset) the MACs
are made with an empty key: they still refuse another team's entries and garbled ones, but anyone
who reaches the store can forge them. Such a team is only as safe as its store, as gloo's; the log
says so once, at debug level. See docs/guide/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import secrets
import struct
from typing import Callable, List, Optional, Tuple

from pycoll import config
from pycoll.errors import AuthError, TransportError

log = logging.getLogger("pycoll")

#: The environment variable that holds the job's key.
KEY_VAR = "PYCOLL_JOB_KEY"
#: Random bytes of a key that pycoll makes (``pycoll run``, rank 0 of an MPI team).
KEY_BYTES = 32
#: Bytes of a team id and of a MAC (HMAC-SHA256, truncated).
ID_BYTES = 16
MAC_BYTES = 16
#: What a signed entry starts with: the writer's rank and the MAC.
SIGNED = struct.Struct(f"<I{MAC_BYTES}s")

Exchange = Callable[[bytes], List[bytes]]
_warned_unkeyed = False


def new_key() -> str:
    """A fresh job key as text (for ``PYCOLL_JOB_KEY``)."""
    return secrets.token_hex(KEY_BYTES)


def space(key: bytes, name: str) -> str:
    """Where the store entries of the team ``name`` lie: under a name derived from ``key`` (one a
    process without the key cannot make), or ``name`` itself without a key."""
    if not key:
        return name
    derived = hmac.new(key, b"pycoll-names\0" + name.encode(), hashlib.sha256).hexdigest()[:24]
    return f"{name}/{derived}"


class Seal:
    """A team's key and random id: MACs of what its ranks write for each other to read."""

    __slots__ = ("key", "team_id", "_base")

    def __init__(self, key: bytes, team_id: bytes) -> None:
        self.key, self.team_id = key, team_id
        self._base = hmac.new(key, team_id, hashlib.sha256)  # (copied for each MAC: one key schedule)

    def settle(self, team_id: bytes) -> None:
        """Take ``team_id`` as the team's (read from rank 0 in the team's first exchange)."""
        self.team_id = team_id
        self._base = hmac.new(self.key, team_id, hashlib.sha256)

    @classmethod
    def fresh(cls, key: Optional[bytes] = None) -> Seal:
        """A new team's seal: ``key`` (a random one if None) and a random team id."""
        return cls(secrets.token_bytes(KEY_BYTES) if key is None else key, secrets.token_bytes(ID_BYTES))

    @property
    def keyed(self) -> bool:
        """Whether there is a key (else the MACs only catch mistakes: anyone can make them)."""
        return bool(self.key)

    def mac(self, name: str, rank: int, content: bytes) -> bytes:
        """The MAC of ``content`` written by ``rank`` as the entry ``name`` of this team."""
        label = name.encode()
        h = self._base.copy()
        h.update(struct.pack("<QI", len(label), rank & 0xFFFFFFFF))
        h.update(label)
        h.update(content)
        return h.digest()[:MAC_BYTES]

    def sign(self, name: str, rank: int, content: bytes) -> bytes:
        """``content`` as rank ``rank`` writes the entry ``name``: its rank and MAC first."""
        return SIGNED.pack(rank, self.mac(name, rank, content)) + content

    def verify(self, name: str, blob: bytes, size: int, rank: Optional[int] = None,
               say: bool = True) -> Tuple[int, bytes]:
        """``(writer's rank, content)`` of the signed entry ``name``; raises :class:`pycoll.AuthError`
        (and logs it, unless ``say`` is false: seen before) for one that is not a rank's of this
        team of ``size`` (or not ``rank``'s)."""
        blob = bytes(blob)
        if len(blob) < SIGNED.size:
            refuse(f"{name}: an entry of {len(blob)} B, too short to be signed", say)
        writer, tag = SIGNED.unpack_from(blob)
        content = blob[SIGNED.size:]
        if not writer < size or (rank is not None and writer != rank):
            refuse(f"{name}: an entry that says it is rank {writer}'s"
                   + (f", where rank {rank}'s belongs" if rank is not None else f" (team of {size})"), say)
        if not hmac.compare_digest(tag, self.mac(name, writer, content)):
            refuse(f"{name}: rank {writer}'s entry fails its MAC (written by a process without the job key, "
                   "or for another team)", say)
        return writer, content


def refuse(why: str, say: bool = True) -> None:
    """Raise (and log, if ``say``) that something read fails its authentication."""
    if say:
        log.warning("pycoll: refused %s", why)
    raise AuthError(f"refused {why}")


def sealed(allgather: Exchange, seal: Seal, rank: int, size: int, what: str, draw: bool = False) -> Exchange:
    """The bootstrap exchange ``allgather(bytes) -> list[bytes]`` with every rank's value signed,
    and checked on the way back, as the entry ``what<round>`` (the store's key names for a
    store's exchange): a value of another exchange or round does not pass. ``draw``: the team's
    id comes with its first round (rank 0 draws it; ``seal`` takes it once every value passed)."""
    rounds = itertools.count()

    def exchange(value: bytes) -> List[bytes]:
        k = next(rounds)
        name, first = f"{what}{k}", draw and k == 0
        if first:
            value = (secrets.token_bytes(ID_BYTES) if rank == 0 else bytes(ID_BYTES)) + bytes(value)
        parts = allgather(seal.sign(name, rank, bytes(value)))
        if len(parts) != size:
            raise TransportError(f"bootstrap exchange {name}: {len(parts)} values for {size} ranks")
        out = [seal.verify(name, p, size, rank=r)[1] for r, p in enumerate(parts)]
        if first:
            if any(len(p) < ID_BYTES for p in out):
                refuse(f"{name}: a value without the team's id")
            seal.settle(out[0][:ID_BYTES])
            out = [p[ID_BYTES:] for p in out]
        return out

    return exchange


def store_seal(name: str, size: int, key: bytes) -> Tuple[Seal, str]:
    """The seal of the store-made team ``name`` and where its entries lie. Its id is drawn by rank
    0 and comes with the team's first exchange (``sealed(..., draw=True)``); a team of one draws
    its own at once."""
    global _warned_unkeyed
    if not key and not _warned_unkeyed:
        _warned_unkeyed = True
        log.debug("pycoll: %s is unset: team %s is only as safe as its store (anyone who reaches the "
                  "store can join or disturb the team; see docs/guide/security.md)", KEY_VAR, name)
    return (Seal.fresh(key) if size == 1 else Seal(key, b"")), space(key, name)


def job_key() -> bytes:
    """This process's ``PYCOLL_JOB_KEY`` (``b""`` where unset)."""
    return config.get(KEY_VAR)


__all__ = ["KEY_VAR", "Seal", "job_key", "new_key", "refuse", "sealed", "space", "store_seal"]
