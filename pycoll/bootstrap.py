"""Bootstrap: how teams come to be (``Team.from_mpi``, ``Team.from_store``, ``split``, local teams)
and go (``Team.close``).

Making a team is collective: the ranks exchange what their transports need (addresses, node keys)
through the bootstrap's ``allgather(bytes) -> list[bytes]`` (an MPI communicator or a key-value
store), pick the point-to-point transport (``PYCOLL_TLS``), learn the topology, map a shared
segment when every rank is on one host, and make the node and rail sub-teams when the team spans
nodes with several ranks on some node. Summation servers (``PYCOLL_NUM_SERVERS``) are set apart
here too: they run the server loop and never get a team.

Every team is bound to its job's key (:mod:`pycoll.auth`): rank 0 of a team made from MPI draws a
key and a team id and sends them over MPI; a team made from a store takes ``PYCOLL_JOB_KEY`` and a
team id rank 0 sends with its first exchange, and keeps its entries under names derived from the key. Every
value of the bootstrap exchange is signed and checked (:func:`pycoll.auth.sealed`), which covers the
transports' addresses and the segment's ids; MPI's exchange uses its buffer calls (mpi4py's
lowercase ones pickle).

mpi4py is imported when an MPI team is made (importing ``mpi4py.MPI`` initialises MPI, which
store-bootstrapped and in-process teams must not do), and the UCX and shared-memory transports
when a team uses them (they need compiled modules a build may lack).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import math
import os
import socket
import struct
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from pycoll import auth, config, lost
from pycoll.algorithms.push_pull import Roles
from pycoll.engine.context import Context, get_context
from pycoll.errors import MismatchError, RevokedError
from pycoll.liveness import Liveness, host_address
from pycoll.news import MPINews
from pycoll.ps.server import serve
from pycoll.ps.worker import PushPull
from pycoll.recovery import Recovery, revoke_here
from pycoll.status import MPIStatus, StoreStatus, free_drained
from pycoll.store import allgather as store_allgather
from pycoll.store import barrier as store_barrier
from pycoll.tl.base import Transport
from pycoll.tl.local import LocalFabric
from pycoll.tl.self import SelfTransport
from pycoll.tl.tcp import TCPTransport, connect_mesh
from pycoll.topology import Topology, node_key

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.team import Team

#: Teams made per store prefix: the n-th team of a prefix is named ``prefix/team<n>`` on every rank.
_store_teams: Dict[str, int] = {}

Exchange = Callable[[bytes], List[bytes]]
#: Bytes a rank's value of an MPI team's bootstrap exchange takes in its one Allgather (its length
#: first): larger values take an Allgatherv after it.
_SLOT = 512
_SLOT_LEN = struct.Struct("<Q")
#: A barrier of a team's bootstrap that calls ``poll()`` (the work it did) while it waits.
Barrier = Callable[[Callable[[], int]], None]


def from_mpi(cls: type, comm: Any, ctx: Optional[Context] = None, tls: Optional[Sequence[str]] = None,
             roles: bool = True) -> Team:
    """See :meth:`pycoll.Team.from_mpi`; ``cls`` is the team class to make."""
    from mpi4py import MPI  # noqa: PLC0415 - see the module docstring

    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"Team.from_mpi needs an mpi4py intracommunicator, got {comm!r}")
    from pycoll.tl.mpi.abort import install  # noqa: PLC0415 - imports mpi4py.MPI

    install()  # an uncaught exception ends the job (PYCOLL_ABORT_ON_ERROR)
    k = config.get("PYCOLL_NUM_SERVERS")
    if roles and k and MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT):
        return with_servers(cls, comm, ctx, tls, k)
    dup = comm.Dup()
    ctx = ctx if ctx is not None else get_context()
    seal = _mpi_seal(dup)
    exchange = auth.sealed(_mpi_exchange(dup), seal, dup.Get_rank(), dup.Get_size(), "mpi")
    if dup.Get_size() == 1:
        transport: Transport = SelfTransport()
    else:
        from pycoll.tl.mpi import MPITransport  # noqa: PLC0415 - imports mpi4py.MPI

        transport = (_p2p_transport("mpi", dup.Get_rank(), dup.Get_size(), exchange, ctx, tls,
                                    _mpi_barrier(dup))
                     or MPITransport(dup))
        ctx.add_transport(transport)
    name = comm.Get_name() or "mpi"
    team = cls(dup.Get_rank(), dup.Get_size(), transport, ctx, name=name)
    team.comm = dup
    if team.size > 1:  # where a timed-out collective asks its peers what they do
        team.planner.peer_status = MPIStatus(dup.Dup(), team.planner, ctx.lock)
        ctx.watch(_answering(team.planner.peer_status))
    live = Liveness(team.rank, team.size, seal, host_address) if team.size > 1 else None
    attach_shm(team, exchange, tls, live)
    _watch_peers(team, live)
    if team.size > 1:  # a rank that finds the calls out of step tells the others there (pycoll.news)
        _hear(team, MPINews(team.planner.peer_status.comm, team.planner.marks, ctx.lock, seal.team_id))
    _strays(team)
    topo = team.topology
    if topo is not None and topo.hierarchical:
        rank = team.rank
        made = []
        for level, color, sub_tls in (("node", topo.nodes[rank], _level_tls("PYCOLL_NODE_TLS", tls)),
                                      ("rail", topo.local_rank(rank), _level_tls("PYCOLL_LEADER_TLS", tls))):
            sub = dup.Split(color, rank)
            try:
                level_team = from_mpi(cls, sub, ctx, tls=sub_tls)
            finally:
                sub.Free()
            level_team.name = f"{name}/{level}{color}"
            made.append(level_team)
        team.levels.node, team.levels.rail = made
    return team


def with_servers(cls: type, comm: Any, ctx: Optional[Context], tls: Optional[Sequence[str]], k: int) -> Team:
    """Workers and servers of ``comm``: the last ``k`` ranks serve push-pull and exit when the
    workers are done; the others get the team of the workers (whose ``push_pull`` uses them)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    n = size - k
    if n < 1:
        raise ValueError(f"PYCOLL_NUM_SERVERS={k} leaves no worker among {size} ranks")
    world = from_mpi(cls, comm, ctx, tls=tls, roles=False)
    world.name = "world"
    sub = world.comm.Split(1 if rank >= n else 0, rank)
    try:
        if rank >= n:
            serve(world, n, k, rank - n)
            raise SystemExit(0)
        team = from_mpi(cls, sub, ctx, tls=tls, roles=False)
    finally:
        sub.Free()
    team.name = "workers"
    team.ps = PushPull(team, Roles(world, n, k))
    atexit.register(team.ps.goodbye_at_exit)
    return team


def from_store(cls: type, store: Any, rank: int, size: int, ctx: Optional[Context] = None, *,
               prefix: str = "pycoll", advertise: Optional[str] = None,
               tls: Optional[Sequence[str]] = None, watch: bool = True) -> Team:
    """See :meth:`pycoll.Team.from_store`; ``cls`` is the team class to make. ``watch``: look at
    the store for a peer's revoke while waiting (a sub-team's comes with its team's)."""
    if not 0 <= rank < size:
        raise ValueError(f"from_store: rank {rank} is not in a team of {size}")
    _store_teams[prefix] = _store_teams.get(prefix, 0) + 1
    team_prefix = f"{prefix}/team{_store_teams[prefix]}"
    ctx = ctx if ctx is not None else get_context()
    seal, space = auth.store_seal(team_prefix, size, auth.job_key())  # (its id comes with its first exchange)
    if size == 1:
        transport: Transport = SelfTransport()
    else:
        exchanges = itertools.count()

        def allgather(value: bytes) -> List[bytes]:  # a fresh key per round: transports call it again
            return store_allgather(store, f"{space}/addr{next(exchanges)}", rank, size, value)

        def barrier(poll: Callable[[], int]) -> None:
            store_barrier(store, f"{space}/barrier{next(exchanges)}", size, poll, _store_timeout(store))

        exchange = auth.sealed(allgather, seal, rank, size, f"{space}/addr", draw=True)
        chosen = _p2p_transport("tcp", rank, size, exchange, ctx, tls, barrier)
        if chosen is None:
            if advertise is None:
                advertise = _local_address(store)
            socks = connect_mesh(rank, size, exchange, seal, advertise=advertise)
            chosen = TCPTransport(rank, size, socks)
            ctx.watch(_weakly(chosen.check_silence, ctx.lock))  # a peer's host that stops answering
        transport = chosen
        ctx.add_transport(transport)
    team = cls(rank, size, transport, ctx, name=team_prefix)
    made: List[Team] = []
    live = None
    try:
        team.store = store
        team.recovery = Recovery(team, store, seal, space, tls, advertise)
        if size > 1:  # where a timed-out collective asks its peers what they do (the watch answers)
            team.planner.peer_status = StoreStatus(store, f"{space}/status", rank, size, team.planner, seal)
        rounds = itertools.count()
        shm = auth.sealed(lambda v: store_allgather(store, f"{space}/shm{next(rounds)}", rank, size, v),
                          seal, rank, size, f"{space}/shm")
        if size > 1:  # (the address its peers on other hosts reach it at: made only where needed)
            live = Liveness(rank, size, seal, lambda: advertise or _local_address(store))
        attach_shm(team, shm, tls, live)
        _watch_peers(team, live)
        _store_news(team)  # (its transport is final now: the segment's may have replaced TCP)
        _strays(team)
        topo = team.topology
        if topo is not None and topo.hierarchical:
            for level, members, color, sub_tls in (
                    ("node", topo.members(topo.nodes[rank]), topo.nodes[rank],
                     _level_tls("PYCOLL_NODE_TLS", tls)),
                    ("rail", topo.rail(topo.local_rank(rank)), topo.local_rank(rank),
                     _level_tls("PYCOLL_LEADER_TLS", tls))):
                made.append(from_store(cls, store, members.index(rank), len(members), ctx,
                                       advertise=advertise, prefix=f"{team_prefix}/{level}{color}",
                                       tls=sub_tls, watch=False))
            team.levels.node, team.levels.rail = made
    except BaseException:  # (a peer lost during the bootstrap: leave nothing registered or open)
        with contextlib.suppress(Exception):  # (the bootstrap's own error is the one to raise)
            for sub in made:
                sub.close()
            close(team)
            if live is not None:
                live.close()
        raise
    if watch:
        team.recovery.start_watching()
    return team


def _revoker(team: Team) -> Callable[[BaseException], None]:
    """What the team's segment calls when it finds a peer's revoke (revoke the team here too), or
    that a peer found the team's calls out of step (so are this rank's)."""
    ref = weakref.ref(team)

    def revoked(error: BaseException) -> None:
        t = ref()
        if t is not None and isinstance(error, RevokedError):
            revoke_here(t, error, str(error))
        elif t is not None and isinstance(error, MismatchError):
            t.planner.marks.learned(error)

    return revoked


def attach_shm(team: Team, allgather: Exchange, tls: Optional[Sequence[str]] = None,
               live: Optional[Liveness] = None) -> None:
    """Learn which node every rank is on (``team.topology``) and map a shared segment if all
    ranks are on one node and ``tls`` (PYCOLL_TLS) allows ``shm`` (collective:
    ``allgather(bytes) -> list[bytes]`` is the team's bootstrap exchange). ``live``'s offer
    (:mod:`pycoll.liveness`) goes with this rank's node key, and it meets the peers' here."""
    if team.size < 2:
        team.topology = Topology((0,))
        return
    if tls is None:
        tls = config.get("PYCOLL_TLS")
    from pycoll.tl.shm import shm_available  # noqa: PLC0415 - the native build is optional

    wanted = "shm" in tls and shm_available()
    mine = f"{node_key()}|{int(wanted)}".encode()
    values = allgather(mine if live is None else mine + b"|" + live.offer())
    if live is not None:
        live.meet([v.rsplit(b"|", 1)[1] for v in values], allgather)
        values = [v.rsplit(b"|", 1)[0] for v in values]
    infos = [v.decode().rsplit("|", 1) for v in values]
    team.topology = Topology.from_keys([key for key, _ in infos])
    ctx = team.ctx
    # (whatever moves the data: a rank that waits on a peer for a core it holds must yield it)
    ctx.local_ranks(len(team.topology.members(team.topology.nodes[team.rank])))
    if team.topology.n_nodes > 1 or not all(w == "1" for _, w in infos):
        return
    from pycoll.tl.shm import ShmSegment  # noqa: PLC0415 - the native build is optional
    from pycoll.tl.shm.transport import ShmTransport, cma_works  # noqa: PLC0415

    team.shared = ShmSegment(team.rank, team.size, allgather)
    team.shared.on_revoked = _revoker(team)
    if ctx.oversubscribed:
        team.shared.oversubscribed()
    # Point to point through the segment too, instead of TCP sockets. An MPI team keeps MPI for
    # point to point: MPICH already uses shared memory on a host, and its small messages cost
    # less than the descriptor protocol driven from Python (measured: 14 against 47 us).
    team.shared.cma = cma_works(team.shared, allgather)
    if team.transport.name == "tcp" and team.shared.cma:
        ctx.remove_transport(team.transport)
        team.transport.close()
        team.transport = ShmTransport(team.shared)
        ctx.add_transport(team.transport)


def _weakly(method: Callable[[], bool], lock: Any = None) -> Callable[[], bool]:
    """An engine watch that calls ``method`` (under ``lock``, if given) while its object lives
    (held weakly: a team dropped without ``close()`` is not kept alive by its engine, and its
    watch then ends)."""
    ref = weakref.WeakMethod(method)

    def look() -> bool:
        bound = ref()
        if bound is None:
            return False
        if lock is None:
            return bound()
        with lock:
            return bound()

    return look


def _answering(asked: MPIStatus) -> Any:
    """The engine's watch that answers the peers' questions."""
    asked.watch = _weakly(asked.answer)
    return asked.watch


def close(team: Team) -> None:
    """Release ``team``'s transport, shared segment and sub-teams (after its last collective)."""
    watching = getattr(team, "liveness", None)
    if watching is not None:  # (its peers learn first that it closed the team: pycoll.lost)
        team.liveness = None
        lost.forget(team, watching)
    if team.recovery is not None:  # (it stops looking at the store)
        team.recovery.close()
    team.ps.close()
    marks = team.planner.marks
    if marks.take is not None:  # (the news of a team made from MPI: before its communicator goes)
        team.ctx.unwatch(marks.take)
        marks.closed()
    asked = team.planner.peer_status
    if asked is not None:
        if isinstance(asked, MPIStatus):
            team.ctx.unwatch(asked.watch)
        team.planner.peer_status = None
    team.planner.close()
    try:
        for sub in team.levels.all():
            if sub is not team:
                sub.close()
        team.levels = type(team.levels)()
        team.ctx.remove_transport(team.transport)
        team.transport.close()
        if team.shared is not None:
            shared, team.shared = team.shared, None
            shared.close()  # (it may raise MismatchError, see ShmSegment.settle)
    finally:
        drained = True  # (last: it waits up to a few seconds for the peers' goodbyes, which a peer
        if isinstance(asked, MPIStatus):  # waiting in a collective learns from the segment's close first)
            drained = asked.close()
        elif asked is not None:
            asked.close()
        comm, team.comm = getattr(team, "comm", None), None
        if comm is not None and drained:  # (the team's duplicate of the communicator it was made
            free_drained(comm)            # from: kept where a peer's last messages may be in it)


def split(team: Team, color: Optional[int], key: int = 0) -> Optional[Team]:
    """See :meth:`pycoll.Team.split`."""
    comm = getattr(team, "comm", None)
    if comm is None:
        raise TypeError(f"{team!r}: split needs a team made by Team.from_mpi")
    from mpi4py import MPI  # noqa: PLC0415 - see the module docstring

    sub = comm.Split(MPI.UNDEFINED if color is None else int(color), int(key))
    if sub == MPI.COMM_NULL:
        return None
    try:
        return from_mpi(type(team), sub, team.ctx)
    finally:
        sub.Free()


def local_teams(cls: type, n: int, ctx: Optional[Context] = None) -> List[Team]:
    """See :func:`pycoll.local_teams`; ``cls`` is the team class to make."""
    if n < 1:
        raise ValueError(f"local_teams needs n >= 1, got {n}")
    ctx = ctx if ctx is not None else Context()
    fabric = LocalFabric(n)
    teams = [cls(r, n, fabric.transport(r), ctx, name=f"local{n}") for r in range(n)]
    for team in teams:  # (a rank that finds the ranks' calls out of step tells the others directly)
        team.planner.marks.news = _told(teams)
        _strays(team)
    topo = Topology.from_keys([node_key(r) for r in range(n)])  # PYCOLL_RANKS_PER_NODE by team rank
    for team in teams:
        team.topology = topo
    if topo.hierarchical:  # in-process sub-teams: one fabric per node and per rail
        for level, groups in (("node", [topo.members(i) for i in range(topo.n_nodes)]),
                              ("rail", [topo.rail(i) for i in range(max(topo.ppn))])):
            for i, members in enumerate(groups):
                sub = LocalFabric(len(members))
                for j, r in enumerate(members):
                    made = cls(j, len(members), sub.transport(j), ctx, name=f"local{n}/{level}{i}")
                    made.topology = Topology(tuple(range(len(members))) if level == "rail"
                                             else (0,) * len(members))
                    setattr(teams[r].levels, level, made)
    return teams


def _hear(team: Team, news: MPINews) -> None:
    """Give ``team``'s marks ``news`` (see :mod:`pycoll.news`): told by this rank, looked at by
    the engine's watch, and probed at every post where that costs little (a team on MPI's point to
    point, with no shared segment)."""
    marks = team.planner.marks
    marks.news = news.tell
    marks.take = _weakly(news.look)
    marks.close_news = news.close
    if team.shared is None and team.transport.name == "mpi":
        marks.pending = news.pending
    team.ctx.watch(marks.take)


def _watch_peers(team: Team, live: Optional[Liveness]) -> None:
    """Have ``team``'s engine look after its peers while it waits (:mod:`pycoll.lost`): a peer that
    left is known on every transport, not only where the transport notices."""
    if live is not None:
        team.liveness = lost.watch(team, live, team.ctx.lock)


def _store_news(team: Team) -> None:
    """The mismatch news of a store-made team (:mod:`pycoll.news`): the store's revoke entry,
    which its watch brings, and, where the transport carries news (TCP), every peer's connection
    too, ahead of anything the rank sends later (a peer that sees this rank close after a mismatch
    has read why first)."""
    marks, transport = team.planner.marks, team.transport
    tell_store = team.recovery.tell  # type: ignore[union-attr]
    tell_peers = getattr(transport, "tell", None)
    if tell_peers is None:
        marks.news = tell_store
        return

    def news(error: BaseException) -> None:
        tell_peers(str(error).encode(errors="replace"))
        tell_store(error)  # type: ignore[arg-type]

    def heard(peer: int, payload: bytes) -> None:
        marks.learned(MismatchError(payload.decode(errors="replace")))

    marks.news = news
    transport.on_news = heard


def _strays(team: Team) -> None:
    """Look for the messages of a peer's other call among those no receive of ``team``'s took,
    while the engine waits (:meth:`pycoll.agreement.Marks.strays`), where its calls are marked."""
    if team.planner.marks.on:
        team.ctx.watch(_weakly(team.planner.marks.strays))


def _told(teams: List[Team]) -> Callable[[BaseException], None]:
    """The news of in-process ranks: every rank learns a mismatch at once."""

    def news(error: BaseException) -> None:
        for team in teams:
            team.planner.marks.learned(error)  # type: ignore[arg-type]

    return news


def _p2p_transport(default: str, rank: int, size: int, allgather: Exchange, ctx: Context,
                   tls: Optional[Sequence[str]] = None, barrier: Optional[Barrier] = None
                   ) -> Optional[Transport]:
    """The point-to-point transport ``tls`` (PYCOLL_TLS) asks for instead of the bootstrap's own
    (``default``: ``mpi`` or ``tcp``), or None to use that. UCX is taken when it is listed before
    ``default`` (or ``default`` is not listed); ``allgather(bytes) -> list[bytes]`` exchanges
    worker addresses; ``barrier`` ends its close."""
    if tls is None:
        tls = config.get("PYCOLL_TLS")
    if "ucx" in tls and (default not in tls or tls.index("ucx") < tls.index(default)):
        from pycoll.tl.ucx import UCXTransport  # noqa: PLC0415 - UCX is optional

        transport = UCXTransport(rank, size, allgather, ctx, barrier)
        if transport.silence < math.inf and any(transport.peer_errors):  # hosts that stop answering
            ctx.watch(_weakly(transport.check_silence, ctx.lock))
        return transport
    return None


def _mpi_exchange(comm: Any) -> Exchange:
    """The bootstrap exchange ``allgather(bytes) -> list[bytes]`` over ``comm``, with MPI's buffer
    calls (mpi4py's lowercase ``allgather`` would unpickle what the peers send): one Allgather of
    a slot of :data:`_SLOT` bytes per rank (its value's length, then the value where it fits),
    and an Allgatherv of the values where one does not."""
    from mpi4py import MPI  # noqa: PLC0415 - see the module docstring

    size = comm.Get_size()

    def allgather(value: bytes) -> List[bytes]:
        value = bytes(value)
        slot = bytearray(_SLOT)
        _SLOT_LEN.pack_into(slot, 0, len(value))
        if len(value) <= _SLOT - _SLOT_LEN.size:
            slot[_SLOT_LEN.size:_SLOT_LEN.size + len(value)] = value
        rows = bytearray(size * _SLOT)
        comm.Allgather([slot, MPI.BYTE], [rows, MPI.BYTE])
        counts = [_SLOT_LEN.unpack_from(rows, r * _SLOT)[0] for r in range(size)]
        if max(counts) <= _SLOT - _SLOT_LEN.size:
            return [bytes(rows[r * _SLOT + _SLOT_LEN.size:r * _SLOT + _SLOT_LEN.size + c])
                    for r, c in enumerate(counts)]
        displs = [sum(counts[:r]) for r in range(size)]
        out = bytearray(sum(counts))
        comm.Allgatherv([value, MPI.BYTE], [out, (counts, displs), MPI.BYTE])
        return [bytes(out[d:d + c]) for c, d in zip(counts, displs)]

    return allgather


def _mpi_seal(comm: Any) -> auth.Seal:
    """The seal of a team made from ``comm``: a key and a team id that rank 0 draws and sends over
    MPI (a channel the job already trusts)."""
    from mpi4py import MPI  # noqa: PLC0415 - see the module docstring

    buf = bytearray(auth.KEY_BYTES + auth.ID_BYTES)
    if comm.Get_rank() == 0:
        made = auth.Seal.fresh()
        buf[:] = made.key + made.team_id
    comm.Bcast([buf, MPI.BYTE], root=0)
    return auth.Seal(bytes(buf[:auth.KEY_BYTES]), bytes(buf[auth.KEY_BYTES:]))


def _mpi_barrier(comm: Any) -> Barrier:
    """A barrier on ``comm`` (MPI's nonblocking one) that polls while it waits."""

    def barrier(poll: Callable[[], int]) -> None:
        req = comm.Ibarrier()
        while not req.Test():
            if not poll():
                time.sleep(0.0002)

    return barrier


def _store_timeout(store: Any) -> float:
    """Seconds ``store`` lets a call wait (pycoll's store: a float; c10d's: a timedelta)."""
    timeout = getattr(store, "timeout", 300.0)
    return float(timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout)


def _level_tls(setting: str, tls: Optional[Sequence[str]]) -> Optional[Sequence[str]]:
    """The transports of a level of sub-teams: its setting, else the parent's ``tls``."""
    return config.get(setting) or tls


def _local_address(store: Any) -> str:
    """The address of this host on the interface that reaches the store (else 127.0.0.1)."""
    local = getattr(store, "local_address", None)  # pycoll's own store knows its connection
    if local is not None:
        return local()
    master = os.environ.get("MASTER_ADDR")  # a c10d store: the host torch's launcher names
    if master and master not in ("localhost", "127.0.0.1", "::1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
                return probe.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"
