"""Marks: the 32 bytes that say which call of its team a message's collective is.

A channel may carry a :class:`Mark`: what the call of its collective is (collective, count,
dtype, op, root, algorithm, and the history of the team's calls; :mod:`pycoll.agreement` makes
and stamps them). Every message sent on such a channel carries the sender's mark ahead of its
payload, and every receive on it compares the mark that arrived with its own before it hands over
the payload: a receive whose mark differs (or whose message is of another size) fails with the
error ``mark.judge(peer, theirs, nbytes, expected)`` makes, and the payload is never delivered. On
the wire a marked message is the mark's bytes followed by the payload's, as one message; a
transport keeps it so however it moves them (one buffer, a two-part send, a header). Transports
that carry marks themselves override ``Transport.isend_marked`` and ``Transport.irecv_marked``;
for the others :mod:`pycoll.tl.base` packs mark and payload into one buffer and unpacks it (a
copy each way). Marks are not counted as payload.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

#: Bytes of a :class:`Mark`.
MARK_BYTES = 32
_U64 = np.dtype("<u8")


class Mark:
    """What every message of one collective carries ahead of its payload (see the module doc).

    ``buf`` holds its :data:`MARK_BYTES` bytes (stable memory that transports send from; the last
    8-byte word is the call's place in its team's history, rewritten for each call of a kept task
    by :meth:`stamp`), ``blob`` the same bytes as ``bytes`` (what receives compare with), ``head``
    the first 24 (the call's fields, which the task keeps) and ``fid`` a 64-bit digest of them;
    ``owner`` (who made it: a team's marks) judges the receives that find another mark
    (:meth:`judge`)."""

    __slots__ = ("buf", "words", "blob", "head", "fid", "owner")

    def __init__(self, fields: bytes, owner: Any) -> None:
        if len(fields) != MARK_BYTES - 8:
            raise ValueError(f"a mark's fields are {MARK_BYTES - 8} bytes, got {len(fields)}")
        self.buf = np.zeros(MARK_BYTES, np.uint8)
        self.buf[:MARK_BYTES - 8] = np.frombuffer(fields, np.uint8)
        self.words = self.buf.view(_U64)
        self.blob = self.buf.tobytes()
        self.head = bytes(fields)
        self.fid = int.from_bytes(hashlib.blake2b(fields, digest_size=8).digest(), "little")
        self.owner = owner

    def stamp(self, history: int) -> None:
        """Set the mark's last word: the call's place in its team's history (``buf`` and ``blob``;
        :meth:`pycoll.agreement.Marks.stamp` writes the same inline)."""
        self.words[3] = history
        self.blob = self.head + history.to_bytes(8, "little")

    def judge(self, peer: int, theirs: bytes, nbytes: int, expected: int) -> BaseException:
        """The error of a receive from ``peer`` whose message carried ``theirs`` where the mark was
        (fewer bytes when the message was shorter), or whose mark matched but whose payload had
        ``nbytes`` (-1: more than fit) where ``expected``: ``owner.judge(self, ...)``'s."""
        return self.owner.judge(self, peer, theirs, nbytes, expected)

    def __repr__(self) -> str:
        return f"<Mark {self.blob.hex()}>"


def unmarked(req: Any, mark: Mark, theirs: Any, nbytes: int, expected: int) -> bool:
    """Whether a marked message that arrived for receive ``req`` may be delivered: its mark
    ``theirs`` (bytes-like; shorter if the message was) is ``mark``'s and its payload of ``nbytes``
    is the ``expected`` size. If not, ``req`` fails with ``mark.judge``'s error (its ``test``
    raises it)."""
    if theirs == mark.blob and nbytes == expected:
        return True
    req.error = mark.judge(req.peer, bytes(theirs), nbytes, expected)
    return False



__all__ = ["MARK_BYTES", "Mark", "unmarked"]
