"""How a rank that finds its team's calls out of step tells the others (the mismatch news).

A receive whose message carries another call's mark (see :mod:`pycoll.agreement`) fails its
collective on that rank, and the team takes no more calls there; its peers may be waiting on it,
or have returned from their part without receiving anything that told them (a bcast's root). The
rank tells them, on a channel of the team's own that no collective uses, and each peer then fails
its collectives in flight and every later call with the same :class:`pycoll.MismatchError`:

* a team made from MPI: a message on the team's status communicator (its own duplicate of the
  team's, :mod:`pycoll.status`) with tag :data:`NEWS_TAG`, to every peer (:class:`MPINews`);
* in-process ranks (``pycoll.local_teams``): at once (see the bootstrap);
* a team made from a store: the revoke's entry in the store, signed, saying so (see
  :mod:`pycoll.recovery`), which the engine's watch looks at.

A peer learns it when its engine waits (its watch looks every ``WATCH_S``, 50 ms), and, on a
team made from MPI without a shared segment, also when it posts a collective, if :data:`PROBE_S`
passed since it last looked (a probe of the status communicator runs MPI's progress, 3-4 us on a
2-rank job: probing at every post made a small collective over MPI's point to point 20-30%
slower, every 200 us still 2-4%): at its next call, or while that call waits (its messages then
carry a history that is not its peers': it fails).
The news is the team's random id, then text of at most :data:`MAX_NEWS` bytes, decoded and never
evaluated; news of another team is dropped (MPI reuses a freed communicator's context, so a closed
team's late news could reach a new team's).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, List

from pycoll.errors import MismatchError
from pycoll.status import linger

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.agreement import Marks

#: The tag of the news on a team's status communicator (its questions and answers take 1 and 2).
NEWS_TAG = 3
#: The longest news (bytes); longer texts are cut.
MAX_NEWS = 4096
#: Seconds between a team's looks for news when it posts.
PROBE_S = 0.001


class MPINews:
    """The mismatch news of a team made from MPI, on its status communicator ``comm``; ``marks``
    are the team's (:class:`pycoll.agreement.Marks`), ``lock`` the engine's, ``team_id`` the
    team's random id (:mod:`pycoll.auth`)."""

    def __init__(self, comm: Any, marks: Marks, lock: Any, team_id: bytes) -> None:
        self.comm, self.marks, self.lock, self.team_id = comm, marks, lock, bytes(team_id)
        self._sent: List[Any] = []
        self._buf = bytearray(len(self.team_id) + MAX_NEWS)
        self._next = 0.0  # (when pending probes again)

    def tell(self, error: MismatchError) -> None:
        """Send ``error``'s text to every peer (called under the engine's lock)."""
        from mpi4py import MPI  # noqa: PLC0415 - only where MPI is in use

        text = self.team_id + str(error).encode(errors="replace")[:MAX_NEWS]
        me = self.comm.Get_rank()
        self._sent += [self.comm.Isend([text, MPI.BYTE], r, NEWS_TAG) for r in range(self.comm.Get_size())
                       if r != me]

    def pending(self) -> bool:
        """Whether a peer's news was waiting, and is taken now: the team takes no more calls (one
        probe of the status communicator, at most every :data:`PROBE_S`; a closed team's news is
        taken and dropped, then it says False)."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + PROBE_S
        return bool(self.comm.Iprobe(tag=NEWS_TAG)) and not self.look()

    def look(self) -> bool:
        """Take a peer's news, if any, and fail the team's calls with it (the engine's watch;
        False: stop looking, the team is out of step already or closed)."""
        from mpi4py import MPI  # noqa: PLC0415

        with self.lock:
            status = MPI.Status()
            msg = self.comm.improbe(tag=NEWS_TAG, status=status)
            if msg is None:
                return self.marks.planner.revoked is None
            n = min(status.Get_count(MPI.BYTE), len(self._buf))
            msg.Recv([self._buf, MPI.BYTE])
            got, size = bytes(self._buf[:n]), len(self.team_id)
            if got[:size] != self.team_id:  # (a closed team's, on a context MPI reused)
                return True
            self.marks.learned(MismatchError(got[size:].decode(errors="replace")))
            return False

    def close(self) -> None:
        """The team closes: the news not yet taken lingers (its peers take it as they close)."""
        linger(self._sent)
        self._sent = []


__all__ = ["MAX_NEWS", "NEWS_TAG", "PROBE_S", "MPINews"]
