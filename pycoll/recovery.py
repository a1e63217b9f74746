"""Revoke, agree and shrink: how the ranks that survive a failure go on (ULFM's model).

A team one of whose ranks died is unusable: its collectives fail, and some ranks may still wait
on peers that gave up. The survivors go on in three steps, as MPI users do with ULFM
(``MPIX_Comm_revoke``, ``MPIX_Comm_agree``, ``MPIX_Comm_shrink``):

* ``team.revoke()``: every pending and later call on the team raises
  :class:`~pycoll.errors.RevokedError` on every rank. The revoking rank fails its own calls in
  flight, says so on the team's shared segment (peers waiting on it there wake at once) and in
  the team's store; the other ranks' engines look at the store every ``WATCH_S`` while they wait
  (news that travels on no transport), so a rank blocked on a peer that gave up is freed.
* ``team.agree(flag)``: the AND of the flags of the ranks still there; the same on every rank
  that returns, even when ranks fail during the agreement itself.
* ``team.shrink()``: a new team of the ranks still there (renumbered in rank order) with fresh
  transports and shared memory and the same engine and transport settings.

How the agreement survives failures: each rank's part of an agreement is one key in the store,
decided once by an atomic compare-and-set: either the rank writes its flag, or a peer that knows
it left writes ``lost`` first. Every rank reads the same decisions, so every rank computes the
same result; a rank that finds its own key decided ``lost`` (it was taken for gone) raises
:class:`~pycoll.errors.PeerLostError`. A rank is known to have left by the team's shared segment
(its process is gone, or it exited, raised or closed the team), by its closed TCP connections,
and otherwise by not reaching the agreement within the timeout.

Every entry of these in the store is signed with the team's :class:`~pycoll.auth.Seal` (its job key,
its random id, the key's name and the writer's rank) and lies where the seal puts the team's
entries: a revoke, an agreement's flag or a ``lost`` that fails its MAC is logged and never acted
on, so only the team's own ranks can revoke it, take part in its agreements or leave a rank out of
a shrink. (An agreement whose entry fails raises :class:`~pycoll.errors.AuthError`.)

Agreement and shrink need a team made from a store (``Team.from_store``, the torch backend's
teams): the store, kept by a process outside the failure (the launcher's, or rank 0's when rank
0 survives), is what the survivors meet in. ``revoke`` works on every team; without a store it
reaches the peers through the shared segment only.
"""

from __future__ import annotations

import itertools
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set

from pycoll.auth import Seal, refuse
from pycoll.errors import AuthError, MismatchError, PeerLostError, PycollError, RevokedError, TimeoutError
from pycoll.status import StoreStatus
from pycoll.store import TCPStore, store_get

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.team import Team

#: What the revoke's entry starts with when it says that the team's calls went out of step.
_MISMATCH = b"mismatch\0"
#: What a rank's key of an agreement holds when a peer decided that the rank left.
LOST = b"lost"
#: The longest pause between two looks at the store while an agreement waits, in seconds.
POLL_MAX_S = 0.02


class Recovery:
    """A store-made team's way back from a failure: its store, its agreements' numbering, the
    watch that brings a peer's revoke. Made by the bootstrap; ``team.revoke()``,
    ``team.agree()`` and ``team.shrink()`` call it. ``seal`` signs and checks the team's entries,
    which lie under ``space`` (see :func:`pycoll.auth.store_seal`)."""

    def __init__(self, team: Team, store: Any, seal: Seal, space: str, tls: Optional[Sequence[str]] = None,
                 advertise: Optional[str] = None) -> None:
        self.team = team
        self.store = store
        self.seal, self.space = seal, space
        self.tls = tls
        self.advertise = advertise
        self._epochs = itertools.count()  # agreements and shrinks, in calling order (the same everywhere)
        self._own_keys: List[str] = []  # this rank's keys of the last agreements (_forget_agreements)
        self._revoked_key = f"{space}/revoked"
        self._refused: Optional[bytes] = None  # a revoke entry that failed its MAC (logged once)
        self._seen_refused: Set[bytes] = set()  # agreement entries that failed theirs (logged once)
        self._watching: Optional[Callable[[], bool]] = None
        self._watcher: Any = store  # the store connection the watch uses (None: not made yet)

    def start_watching(self) -> None:
        """Look at the store for a peer's revoke while the engine waits (top-level teams: a
        sub-team is revoked with its team). With pycoll's TCPStore, on a connection of its own
        made at the first look (a look must not queue behind another thread's blocking
        ``get``); the engine holds the look weakly, so a team dropped without ``close()`` stops
        being looked for."""
        if self._watching is None:
            self._watcher = None  # (connected at the first look: making a team connects nothing more)
            ref = weakref.WeakMethod(self.look)

            def look() -> bool:
                method = ref()
                return method is not None and method()

            self._watching = look
            self.team.ctx.watch(look)

    def close(self) -> None:
        """The team closes: stop looking."""
        if self._watching is not None:
            self.team.ctx.unwatch(self._watching)
            self._watching = None
        own = self._watcher is not None and self._watcher is not self.store
        close = getattr(self._watcher, "close", None) if own else None
        if close is not None:
            close()
        self._watcher = self.store

    def rebind(self, store: Any) -> None:
        """Meet in ``store`` from now on (a shrunk team, bootstrapped through a guarded view of it)."""
        watching = self._watching is not None
        self.close()
        self.store = self._watcher = store
        if watching:
            self.start_watching()

    # ------------------------------------------------------------------ revoke
    def publish(self, error: RevokedError) -> None:
        """Tell the peers through the store that this rank revoked the team."""
        key = self._revoked_key
        self.store.set(key, self.seal.sign(key, self.team.rank, str(error).encode()))

    def tell(self, error: MismatchError) -> None:
        """Tell the peers through the store that this rank found the team's calls out of step
        (:mod:`pycoll.news`): the revoke's entry, saying so (the watch that brings a revoke brings
        it, as :class:`MismatchError`)."""
        key = self._revoked_key
        self.store.set(key, self.seal.sign(key, self.team.rank, _MISMATCH + str(error).encode()))

    def look(self) -> bool:
        """If a peer revoked the team, revoke it here too, and answer the peers' questions (the
        engine's watch; False: stop)."""
        if self.team.planner.revoked is not None:
            return False
        if self._watcher is None:
            self._watcher = _own_connection(self.store)
        asked = self.team.planner.peer_status
        if isinstance(asked, StoreStatus):  # a peer's question about a collective that timed out
            asked.answer(self._watcher)
        if not self._watcher.check([self._revoked_key]):
            return True
        blob = store_get(self._watcher, self._revoked_key)
        if blob == self._refused:
            return True
        try:
            rank, said = self.seal.verify(self._revoked_key, blob, self.team.size)
        except AuthError:  # (logged) a stranger's revoke: not acted on
            self._refused = blob
            return True
        if said.startswith(_MISMATCH):  # (a peer found the calls out of step: see tell)
            self.team.planner.marks.learned(MismatchError(said[len(_MISMATCH):].decode(errors="replace")))
            return False
        text = said.decode(errors="replace")
        revoke_here(self.team, RevokedError(text, rank=rank), text)
        return False

    # ------------------------------------------------------------------ agreement
    def lost(self) -> Set[int]:
        """The ranks known to have left for good (segment, closed connections)."""
        team = self.team
        out = set(team.transport.lost_peers())
        if team.shared is not None:
            out |= team.shared.gone()
        return out

    def decide(self, flag: bool, timeout: Optional[float]) -> Dict[int, bool]:
        """One agreement: ``{rank: flag}`` of the ranks that took part (the same on every rank
        that returns). See the module docstring for how it survives failures."""
        team, store = self.team, self.store
        epoch = next(self._epochs)
        base = f"{self.space}/agree{epoch}"
        mine = self._settle(base, team.rank, b"1" if flag else b"0")
        self._forget_agreements(f"{base}/{team.rank}")
        if mine == LOST:
            raise PeerLostError(f"{team.name}: rank {team.rank} reached agreement #{epoch} after its "
                                "peers had given it up for lost (past their timeout)", rank=team.rank)
        t = team.ctx.timeout if timeout is None else timeout
        deadline = time.monotonic() + t if t is not None else None
        fates: Dict[int, bytes] = {team.rank: mine}
        waiting = [r for r in range(team.size) if r != team.rank]
        pause = 0.0005
        while waiting:
            keys = [f"{base}/{r}" for r in waiting]
            if store.check(keys):  # (one round trip a look, whatever the number of ranks)
                for r, key in zip(waiting, keys):
                    try:
                        fates[r] = self._decided(base, r, store_get(store, key))
                    except AuthError:  # (a stranger's entry: its rank, or a peer, replaces it)
                        pass
                waiting = [r for r in waiting if r not in fates]
                if not waiting:
                    break
            team.ctx.progress()  # (a transport learns of closed connections as it reads)
            late = deadline is not None and time.monotonic() >= deadline
            gone = set(waiting) if late else self.lost().intersection(waiting)
            for r in sorted(gone.intersection(waiting)):  # decide for it, unless it decided first
                fates[r] = self._settle(base, r, LOST)
                waiting.remove(r)
            time.sleep(pause)
            pause = min(pause * 2, POLL_MAX_S)
        return {r: v == b"1" for r, v in sorted(fates.items()) if v != LOST}

    def _settle(self, base: str, r: int, fate: bytes) -> bytes:
        """Write ``fate`` as rank ``r``'s in the agreement ``base`` unless a rank of the team decided
        it already (signed, as hex: c10d stores take text for compare_set); the fate decided. An
        entry that is no rank's (a stranger's) is replaced, atomically, as if it were not there."""
        key = f"{base}/{r}"
        signed = self.seal.sign(key, self.team.rank, fate).hex().encode()
        value = _compare_set(self.store, key, b"", signed)
        while True:
            try:
                return self._decided(base, r, value)
            except AuthError:  # (logged) replace it, unless a rank of the team did meanwhile
                value = _as_bytes(self.store.compare_set(key, value, signed))

    def _decided(self, base: str, r: int, value: bytes) -> bytes:
        """The fate of rank ``r`` in the agreement ``base`` as the store holds it (``1``, ``0`` or
        :data:`LOST`), checked: only ``r`` gives its flag, any rank of the team may write ``lost``;
        anything else raises :class:`~pycoll.errors.AuthError` (logged once)."""
        key = f"{base}/{r}"
        value = bytes(value)
        say = value not in self._seen_refused
        try:
            blob = bytes.fromhex(value.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            blob = b""
        try:
            writer, fate = self.seal.verify(key, blob, self.team.size, say=say)
            if fate not in (b"1", b"0", LOST) or (fate != LOST and writer != r):
                refuse(f"{key}: rank {writer} wrote {fate[:16]!r} as rank {r}'s fate", say)
        except AuthError:
            self._seen_refused.add(value)
            raise
        return fate

    def _forget_agreements(self, key: str) -> None:
        """Keep this rank's key of the agreement just decided; delete the one of the agreement
        before the last (every rank that took part in the last one has read it: a rank reaches
        an agreement only after reading every key of the one before, or being given up for
        lost), so that the store holds at most two agreements' keys of each team."""
        self._own_keys.append(key)
        while len(self._own_keys) > 2:
            old = self._own_keys.pop(0)
            delete = getattr(self.store, "delete_key", None)
            if delete is not None:
                delete(old)

    def shrink(self, timeout: Optional[float]) -> Team:
        """A new team of the ranks still there (see :meth:`pycoll.Team.shrink`)."""
        team = self.team
        t = team.ctx.timeout if timeout is None else timeout
        deadline = time.monotonic() + t if t is not None else None
        members = sorted(self.decide(True, timeout))
        prefix = f"{team.name}/shrink{next(self._epochs)}"
        guard = _Guarded(self.store, self, members, deadline)
        try:
            new = type(team).from_store(guard, members.index(team.rank), len(members), team.ctx,
                                        prefix=prefix, advertise=self.advertise, tls=self.tls)
        finally:
            guard.release()  # (the new team's transports keep the exchange: let go of this team)
        for t in [new, *new.levels.all()]:
            t.store = self.store
            if t.recovery is not None:
                t.recovery.rebind(self.store)
        return new


def revoke(team: Team, why: str = "") -> None:
    """Revoke ``team`` (see :meth:`pycoll.Team.revoke`)."""
    if team.planner.revoked is not None:
        return
    error = RevokedError(f"{team.name} was revoked by rank {team.rank}" + (f": {why}" if why else ""),
                         rank=team.rank)
    recovery = team.recovery
    if recovery is not None:
        recovery.publish(error)
    revoke_here(team, error, why or "no reason given")


def revoke_here(team: Team, error: RevokedError, why: str) -> None:
    """Revoke ``team`` on this rank: mark its shared segments (and its sub-teams': an express
    lane finds them unusable from now on), fail its calls in flight, refuse later ones. Under the
    engine's lock: the progress thread's watch may call it while the program posts."""
    teams = [team, *team.levels.all()]
    with team.ctx.lock:
        for t in teams:
            if t.shared is not None:
                t.shared.revoke(error, why)
        for t in teams:
            t.planner.revoke(error)


def need_recovery(team: Team, what: str) -> Recovery:
    """The team's :class:`Recovery`, or a clear error for a team without a store."""
    if team.recovery is None:
        raise PycollError(f"{what} needs a team made from a store (Team.from_store, the torch backend): "
                          f"{team!r} has none to meet in after a failure")
    return team.recovery


def _compare_set(store: Any, key: str, expected: bytes, desired: bytes) -> bytes:
    return _as_bytes(store.compare_set(key, expected.decode(), desired.decode()))


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else bytes(value)


class _Guarded:
    """The store as a shrink's bootstrap sees it: a ``get`` that waits for a key, but raises
    :class:`PeerLostError` if the member that was to set it is known to have left meanwhile,
    and :class:`TimeoutError` past the shrink's deadline (else a member that dies during the
    shrink would hold the others for the store's whole timeout). The bootstrap's keys end in the
    new team's rank of the member that sets them (``pycoll.store.allgather``). Only the awaited
    member's loss counts: every member that gets past a round saw the same keys, so the members
    do not end a shrink some with a team and some with an error because of a loss they saw at
    different times."""

    def __init__(self, store: Any, recovery: Recovery, members: List[int], deadline: Optional[float]) -> None:
        self._store = store
        self._recovery: Optional[Recovery] = recovery
        self._members = members
        self._deadline = deadline

    def release(self) -> None:
        """The bootstrap is over: a plain store from now on, holding no team."""
        self._recovery = None

    def get(self, key: str) -> bytes:
        recovery = self._recovery
        if recovery is None:
            return store_get(self._store, key)
        tail = key.rsplit("/", 1)[-1]
        awaited = self._members[int(tail)] if tail.isdigit() and int(tail) < len(self._members) else None
        pause = 0.0005
        while not self._store.check([key]):
            if self._deadline is not None and time.monotonic() >= self._deadline:
                raise TimeoutError(f"{recovery.team.name}: shrink: key {key!r} was not set in time")
            recovery.team.ctx.progress()  # (a transport learns of closed connections as it reads)
            if awaited is not None and awaited in recovery.lost():
                raise PeerLostError(f"{recovery.team.name}: rank {awaited} left during the shrink; "
                                    "shrink again", rank=awaited)
            time.sleep(pause)
            pause = min(pause * 2, POLL_MAX_S)
        return store_get(self._store, key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _own_connection(store: Any) -> Any:
    """A connection to pycoll's TCPStore of its own (given up after a second if the server is
    gone: then the store's own connection); any other store (c10d's) is shared as it is (a clone
    would connect anew, retrying for its whole timeout if the store's host has left)."""
    if isinstance(store, TCPStore):
        try:
            return TCPStore(store.host, store.port, timeout=store.timeout, connect_timeout=1.0)
        except PycollError:
            return store
    return store


__all__ = ["LOST", "Recovery", "need_recovery", "revoke", "revoke_here"]
