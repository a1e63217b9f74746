"""What a team does when a peer has left: which of its collectives fail, and when.

One job: turn what :mod:`pycoll.liveness` knows (who left, how, and what it had done) into
``PeerLostError`` on the collectives that can no longer finish, naming the peer (its rank, pid and
host). The engine runs :meth:`LostPeers.look` every ``WATCH_S`` while it waits, so a rank that
waits learns within a watch or two of the peer's leaving, on every transport.

Which collectives fail: every one of the team's in flight that the peer left unfinished, on every
rank, whether it waits on that peer itself or on a rank that does (all the team's, not only those
that wait on the peer: a collective needs every rank, and a rank that waits on a peer which waits
on the lost one would otherwise learn nothing until its timeout). What the peer had finished is
left to finish:

* a peer that said how it left (it exited, raised or closed the team: see :mod:`pycoll.liveness`)
  said how many untagged collectives it had posted and which it left unfinished: an untagged
  collective it never posted fails at once; one it left unfinished fails after
  :data:`GRACE_S` (what it sent before it left may still be arriving); one it finished goes on (a
  rank that returns from main after its last collective breaks nobody's). A collective of a user
  tag goes on unless the peer left it unfinished (the count of a tag's uses is not said): it ends
  at its timeout, or when a peer that waited on the lost one gives up and leaves in turn;
* a peer whose process ended without a word (a signal, ``os._exit``) or whose host stopped
  answering: every collective of the team in flight fails after :data:`GRACE_S` of the engine
  taking in what already arrived, and so does every later one (a peer that ended after its last
  collective, while another rank still waited on a slow third, makes that rank's fail too).

Point to point (``team.send``/``team.recv``) fails only where its own peer left. A collective on
the host's shared segment is the segment's to fail (it sees which generation each rank reached,
and the markers of ranks that left: :mod:`pycoll.tl.shm.leaving`). Later calls are not refused
before they are sent: each fails at the first watch while it waits, as above.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from pycoll.agreement import GRACE_S
from pycoll.errors import MismatchError, PeerLostError
from pycoll.liveness import CLOSED, OUT_OF_STEP_SAYS, Left, Liveness, wire_key
from pycoll.tasks.keys import key_of
from pycoll.tasks.schedule import Schedule

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.tasks.task import Task

Team = Any  # (a pycoll.Team: not imported, the team module imports this one through the bootstrap)



def _key(task: Task) -> Optional[tuple]:
    """The message key of the collective ``task`` is (see :func:`pycoll.tasks.keys.key_of`); None
    also for a collective on the shared segment (its express lane runs it again under new numbers
    without rekeying it)."""
    if getattr(task, "seg", None) is not None:
        return None
    return key_of(task, task.waiting_on() if isinstance(task, Schedule) else [task])


def state(planner: Any) -> Tuple[int, List[tuple]]:
    """What this rank says of ``planner``'s team when it leaves: the untagged collectives it has
    posted, and the keys of those in flight (waits up to a second for the engine)."""
    ctx = planner.ctx
    if not ctx.lock.acquire(timeout=1.0):
        return -1, []
    try:
        return planner.posted(), [k for k in (_key(t) for t in ctx.owned((planner,))) if k is not None]
    finally:
        ctx.lock.release()


class LostPeers:
    """The watch of one team over its peers (made by :func:`watch`)."""

    def __init__(self, team: Team, live: Liveness) -> None:
        self._team = weakref.ref(team)
        self.live = live
        #: Collectives failed here because a peer left.
        self.failed = 0
        #: What the engine calls (see :func:`watch`).
        self.engine_watch: Optional[Callable[[], bool]] = None

    def look(self) -> bool:
        """Fail the collectives that a peer's leaving dooms (see the module docstring); the
        engine's watch, under its lock. False once the team is gone: stop."""
        team = self._team()
        if team is None:
            return False
        lost = self.live.look()
        if not lost:
            return True
        planner = team.planner
        if planner.revoked is None and planner.marks.take is not None:
            planner.marks.take()  # (a peer's mismatch news first: why it left, its calls failed with it)
        told = [(r, left) for r, left in sorted(lost.items()) if left.how.startswith(OUT_OF_STEP_SAYS)]
        if told:  # (a peer that left after it found the calls out of step: MismatchError, not lost)
            self._out_of_step(team, *told[0])
            return True
        if planner.revoked is not None:  # (out of step or revoked: its calls failed, later ones refused)
            return True
        now = _take_in(planner.ctx, lost)
        for task in planner.ctx.owned((planner,)):
            if getattr(task, "seg", None) is not None:  # (the segment's to judge)
                continue
            peer = getattr(task, "peer", None)
            key = None if isinstance(peer, int) else _key(task)
            doomed = [r for r, left in lost.items() if _dooms(left, r, peer, key, now)]
            if doomed:
                task.fail(self.error(team, lost, doomed, task, key))
                self.failed += 1
        return True

    def _out_of_step(self, team: Team, rank: int, left: Left) -> None:
        """Peer ``rank`` left (``left``) after it found the team's calls out of step: later calls
        are refused, and the collectives in flight fail with MismatchError once the engine took
        in, for :data:`GRACE_S`, what the peer sent before (this rank may still be finishing a
        collective the peer finished: it finishes)."""
        planner = team.planner
        why = left.how[len(OUT_OF_STEP_SAYS):].strip()
        error = MismatchError(f"{team.name}: the ranks' calls went out of step: rank {rank} found that {why}")
        _take_in(planner.ctx, {rank: left})
        if planner.revoked is None:
            planner.revoked = error
        planner.ctx.fail_owned((planner,), error)

    @staticmethod
    def error(team: Team, lost: Dict[int, Left], doomed: List[int], task: Optional[Task] = None,
              key: Optional[tuple] = None) -> PeerLostError:
        """The error of a collective (``task``, of message ``key``) that the peers ``doomed``
        left: those that ended first named first, then those that said they left."""
        doomed = sorted(doomed, key=lambda r: (lost[r].said, lost[r].seen, r))
        first = lost[doomed[0]]
        text = "; ".join(lost[r].words(r) for r in doomed)
        if task is not None:
            text += f" while rank {team.rank} waited in {task.name}"
            if key:
                text += f" (#{key[1]})" if key[0] == "c" else f" (use {key[2]} of tag {key[1]!r})"
        return PeerLostError(f"{team.transport.name}: {text}", rank=doomed[0], pid=first.pid, how=first.how)


def _take_in(ctx: Any, lost: Dict[int, Left]) -> float:
    """Run the engine until the grace of every peer lost less than :data:`GRACE_S` ago is over
    (those that said they left with nothing unfinished need none), taking in what they sent before
    they left (a watch comes only every ``WATCH_S``: waiting for the next would add that to every
    detection); the time then."""
    now = time.monotonic()
    until = max((left.seen + GRACE_S for left in lost.values() if not left.said or left.unfinished),
                default=now)
    while now < until:
        if not ctx.progress():
            time.sleep(0.0005)
        now = time.monotonic()
    return now


def _dooms(left: Left, rank: int, peer: Optional[int], key: Optional[tuple], now: float) -> bool:
    """Whether ``rank``, which left as ``left`` says, dooms a collective of message ``key`` (or a
    point-to-point operation with ``peer``) at ``now``."""
    late = now - left.seen >= GRACE_S
    if isinstance(peer, int):
        return peer == rank and late
    if not left.said:
        return late
    wired = wire_key(key)
    if wired is None:
        return False
    if wired[0] == 0 and wired[2] >= left.posted:  # an untagged collective it never posted
        return True
    return wired in left.unfinished and late


def watch(team: Team, live: Liveness, lock: Any) -> LostPeers:
    """Have the engine of ``team`` look after its peers with ``live`` (see :class:`LostPeers`)
    while it waits, under ``lock``; say this rank's state when it leaves; and let the transport's
    ``lost_peers`` (an agreement's, a shrink's) see whom it finds gone."""
    lost = LostPeers(team, live)
    planner_ref = weakref.ref(team.planner)

    def said() -> Tuple[int, List[tuple]]:
        planner = planner_ref()
        return (-1, []) if planner is None else state(planner)

    def out_of_step() -> str:
        planner = planner_ref()
        revoked = None if planner is None else planner.revoked
        return str(revoked).split(": ", 1)[-1] if isinstance(revoked, MismatchError) else ""

    live.state = said
    live.out_of_step = out_of_step
    ref = weakref.ref(lost)

    def look() -> bool:
        watcher = ref()
        if watcher is None:
            return False
        with lock:
            return watcher.look()

    lost.engine_watch = look
    team.ctx.watch(look)
    team.transport.gone = live.gone
    return lost


def forget(team: Team, lost: LostPeers) -> None:
    """``team`` closes: say so to its peers and stop watching them."""
    if lost.engine_watch is not None:
        team.ctx.unwatch(lost.engine_watch)
    lost.live.leave(CLOSED)
    if getattr(team.transport, "gone", None) == lost.live.gone:
        team.transport.gone = None


__all__ = ["GRACE_S", "LostPeers", "forget", "state", "watch"]
