"""``pycoll.mpi.Comm``: an mpi4py look-alike whose collectives run on pycoll.

Switching an mpi4py program means changing the communicator object only::

    from mpi4py import MPI
    from pycoll.mpi import Comm
    comm = Comm(MPI.COMM_WORLD)
    comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)          # blocking, as mpi4py's
    comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.MAX).Wait()  # non-blocking

Buffer arguments are what mpi4py accepts, read as mpi4py reads them: a buffer, ``[buf, MPI.FLOAT]``,
``[buf, count, MPI.FLOAT]``, ``[buf, (count, displ), MPI.FLOAT]`` or ``[buf, count, displ,
MPI.FLOAT]`` (a count of a buffer that holds one block per rank is one block's, as in MPI), the
vector forms with counts and displacements, and ``MPI.IN_PLACE`` as the send buffer (see
:mod:`pycoll.mpispec`).
Everything pycoll does not implement (other methods, ops it has not, derived datatypes, device
memory) is passed through to the mpi4py communicator; ``Comm(intercomm)`` hands every collective of
an intercommunicator to MPI (:mod:`pycoll.mpi_inter`).

pycoll's errors reach mpi4py callers as ``MPI.Exception`` (that are pycoll's errors too): ranks
that disagree raise :class:`MismatchMPIError` (class ``MPI.ERR_TRUNCATE``), a peer that left
:class:`PeerLostMPIError` (``MPI.ERR_PROC_FAILED``), a timeout or another transport failure
``MPI.ERR_OTHER``; each carries pycoll's text and attributes.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
from mpi4py import MPI

from pycoll.collectives import TABLE, Collective
from pycoll.dtypes import is_supported
from pycoll.engine.context import Context
from pycoll.errors import PycollError
from pycoll.mpi_errors import (  # noqa: F401 - pycoll.mpi's names (the errors mpi4py callers catch)
    ClosedMPIError,
    MismatchMPIError,
    PeerLostMPIError,
    RevokedMPIError,
    TimeoutMPIError,
    TransportMPIError,
    mpi_error,
)
from pycoll.mpi_inter import InterComm
from pycoll.mpi_requests import Handed, Prequest, Request, testall, waitall  # noqa: F401 - pycoll.mpi's names
from pycoll.mpispec import (
    Spec,
    Specs,
    alltoallw_bytes,
    as_buffer,
    as_vbuffer,
    device_memory,
    hold,
    hold_all,
    keep_failed,
)
from pycoll.ops import mpi_op_known
from pycoll.persistent import UNSTABLE, RecentCalls, buffer_dtype, repeat_key
from pycoll.team import Persistent, Team

log = logging.getLogger("pycoll")


_told: set = set()


def foreign_op(method: str, values: Dict[str, Any]) -> bool:
    """Whether a reduction's op is one pycoll has not (user-defined from ``MPI.Op.Create``,
    ``MAXLOC``, ``MINLOC``, ``REPLACE``, ``NO_OP``): then the Comm hands the call to MPI before
    anything is sent, on every rank alike (MPI has every rank pass the same op), and says so once
    in the debug log."""
    op = values.get("op")
    if not isinstance(op, MPI.Op) or mpi_op_known(op):
        return False
    if (method, "op") not in _told:
        _told.add((method, "op"))
        log.debug("pycoll.mpi.Comm: %s with an op pycoll has not (user-defined, MAXLOC, MINLOC, "
                  "REPLACE, NO_OP) is handed to MPI", method)
    return True


def unreduced(method: str, kwargs: Dict[str, Any]) -> bool:
    """Whether a reduction's buffers are of a type pycoll has no reduction for (``long double``,
    ``complex long double``): then the Comm hands the call to MPI before anything is sent, on
    every rank alike (their buffers' types agree), and says so once in the debug log."""
    for arr in kwargs.values():
        if isinstance(arr, np.ndarray) and not is_supported(arr.dtype):
            if (method, arr.dtype) not in _told:
                _told.add((method, arr.dtype))
                log.debug("pycoll.mpi.Comm: %s of %s is handed to MPI (no reduction of that type here)",
                          method, arr.dtype)
            return True
    return False


#: Arguments that are never handed to MPI by themselves: host arrays, counts, ops, None.
_PLAIN = frozenset((np.ndarray, int, type(None), MPI.Op, type(MPI.IN_PLACE)))


def handed(row: Collective, method: str, values: Dict[str, Any]) -> bool:
    """Whether the Comm hands this call to MPI, before anything is sent (said once per kind in the
    debug log): a buffer in device memory (``__cuda_array_interface__`` without a host buffer:
    pycoll moves host memory only), a derived datatype (indexed, vector, struct: gaps pycoll
    does not walk), or ``MPI.IN_PLACE`` where the collective has none. Every rank must pass
    buffers of the same kind."""
    why = ""
    if values.get("sendbuf") is MPI.IN_PLACE and not row.mpi_in_place:
        why = "in place"
    for v in values.values():
        if why:
            break
        if type(v) in _PLAIN:  # (the common case, first: this runs for every new call)
            continue
        obj = v[0] if isinstance(v, (list, tuple)) and v else v
        kind = v[-1] if isinstance(v, (list, tuple)) and v else None
        if isinstance(kind, MPI.Datatype) and kind != MPI.DATATYPE_NULL and \
                kind.Get_envelope()[-1] != MPI.COMBINER_NAMED:
            why = "a derived datatype"
        elif device_memory(obj):
            why = "device memory"
    if why and (method, why) not in _told:
        _told.add((method, why))
        log.debug("pycoll.mpi.Comm: %s with %s is handed to MPI", method, why)
    return bool(why)


def in_place_copy(row: Collective, kw: Dict[str, Any], rank: int, size: int,
                  copies: Optional[list] = None) -> None:
    """``MPI.IN_PLACE`` where the input is the receive buffer, whole (``Alltoall(v)``,
    ``Reduce_scatter(_block)``): send a copy of it, and (the reduce-scatters) put this rank's
    result at its start. ``copies`` gets ``(copy, whole)`` (a persistent call copies at each start)."""
    whole = kw["recvbuf"]
    kw["sendbuf"] = whole.copy()
    if copies is not None:
        copies.append((kw["sendbuf"], whole))
    if row.name == "alltoallv":
        kw["sendcounts"], kw["sdispls"] = kw["recvcounts"], kw["rdispls"]
    elif row.name == "reduce_scatter":
        kw["recvbuf"] = whole[:whole.size // size]
    elif row.name == "reduce_scatterv":
        counts = kw.get("counts")
        if counts is None or len(counts) != size:
            raise ValueError(f"Reduce_scatter with MPI.IN_PLACE: recvcounts must give {size} counts")
        kw["recvbuf"] = whole[:int(counts[rank])]


#: What a check of a call's arguments raises (before anything is sent): a rank whose call raises
#: one takes part in the call as a rejection (:meth:`Comm.rejected`).
ARGUMENT_ERRORS = (ValueError, TypeError, BufferError, OverflowError)
#: mpi4py's defaults of the collectives' optional parameters.
_DEFAULTS = {"op": MPI.SUM, "root": 0, "recvcounts": None}
_BUFFERS = frozenset(("buf", "sendbuf", "recvbuf"))


class Comm:
    """An mpi4py communicator whose collectives go through pycoll (a :class:`pycoll.Team`).

    Every collective of the table (:mod:`pycoll.collectives`) that MPI has gets mpi4py's three
    forms: blocking (``Allgather``), non-blocking (``Iallgather``, returns a :class:`Request`) and
    persistent (``Allgather_init``, returns a :class:`Prequest`). pycoll's keywords (``priority``,
    ``tag``, ``algorithm``, ``timeout``) may follow the MPI arguments. For ``Gatherv``/``Scatterv``
    only the root knows the counts (as in MPI), so they run the ``linear`` algorithm unless
    ``algorithm=`` says otherwise. Everything else is passed through to the mpi4py communicator.
    """

    def __new__(cls, comm: Any = None, ctx: Optional[Context] = None) -> Any:
        if isinstance(comm, MPI.Intercomm):  # (MPI runs its collectives: pycoll.mpi_inter)
            return InterComm(comm, lambda c: Comm(c, ctx))
        return super().__new__(cls)

    def __init__(self, comm: Any = None, ctx: Optional[Context] = None) -> None:
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.team = Team.from_mpi(self.comm, ctx)
        #: The last calls, by method and first argument: a call repeated with the same mpi4py
        #: arguments runs as a persistent collective (see :class:`pycoll.persistent.Repeated`).
        self.recent = RecentCalls()
        #: The buffer arguments in every form mpi4py accepts, made canonical (the same object for the
        #: same buffer and layout: see :class:`pycoll.mpispec.Specs`), so that their repeats are known.
        self.specs = Specs()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)

    @property
    def rank(self) -> int:
        return self.team.rank

    @property
    def size(self) -> int:
        return self.team.size

    def Alltoallw(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Alltoallw`` on pycoll: with predefined datatypes an alltoallv of bytes
        (counts in each block's datatype, displacements in bytes); derived datatypes and
        ``MPI.BOTTOM`` go to MPI."""
        try:
            args = alltoallw_bytes(sendbuf, recvbuf, self.team.size)
        except ARGUMENT_ERRORS as exc:
            raise self.rejected("Alltoallw", exc, "alltoallv") from None
        if args is None:
            return self.comm.Alltoallw(sendbuf, recvbuf)
        try:
            self.team.alltoallv(*args).wait()
        except PycollError as exc:
            raise mpi_error(exc) from None
        return None

    def Ialltoallw(self, sendbuf: Any, recvbuf: Any) -> Any:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Ialltoallw`` on pycoll (see :meth:`Alltoallw`)."""
        try:
            args = alltoallw_bytes(sendbuf, recvbuf, self.team.size)
        except ARGUMENT_ERRORS as exc:
            raise self.rejected("Ialltoallw", exc, "alltoallv") from None
        if args is None:
            return self.comm.Ialltoallw(sendbuf, recvbuf)
        try:
            return Request(self.team.alltoallv(*args))
        except PycollError as exc:
            raise mpi_error(exc) from None

    def Alltoallw_init(self, sendbuf: Any, recvbuf: Any) -> Any:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Alltoallw_init`` on pycoll (see :meth:`Alltoallw`)."""
        copies: list = []
        args = alltoallw_bytes(sendbuf, recvbuf, self.team.size, copies)
        if args is None:
            return self.comm.Alltoallw_init(sendbuf, recvbuf)
        try:
            return Prequest(self.team.alltoallv_init(*args), copies)
        except PycollError as exc:
            raise mpi_error(exc) from None

    def rejected(self, method: str, error: Exception, coll: Optional[str] = None) -> BaseException:
        """The error to raise for a call of ``method`` whose arguments failed this rank's checks
        (``error``, before anything was sent): this rank takes its part in the call as a rejection
        (:meth:`pycoll.planner.Planner.reject`), so that peers that posted it raise too instead
        of waiting. ``error`` itself when every rank rejected the call (the Comm stays usable);
        else an ``MPI.Exception`` that is a :class:`pycoll.MismatchError`, on every rank."""
        if isinstance(error, PycollError) and not isinstance(error, ValueError):
            return error  # (the engine's own errors: the call was posted; pycoll's ValueErrors are checks')
        err = self.team.planner.reject(method, error, coll=coll)
        if err is error:
            return error
        flavoured = mpi_error(err) if isinstance(err, PycollError) else err
        flavoured.__cause__ = error
        return flavoured

    # -- communicator constructors: a new communicator stays on pycoll (MPI's COMM_NULL stays null)
    def derived(self, comm: Any) -> Any:
        """A :class:`Comm` over ``comm``, a communicator made from this one (on this process's
        engine); ``MPI.COMM_NULL`` as it is (a rank outside the new communicator)."""
        if comm == MPI.COMM_NULL:
            return comm
        return Comm(comm, self.team.ctx)

    def Dup(self, info: Any = None) -> Comm:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Dup``, on pycoll."""
        return self.derived(self.comm.Dup() if info is None else self.comm.Dup(info))

    def Clone(self) -> Comm:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Clone``, on pycoll."""
        return self.derived(self.comm.Clone())

    def Dup_with_info(self, info: Any) -> Comm:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Dup_with_info``, on pycoll."""
        return self.derived(self.comm.Dup_with_info(info))

    def Idup(self, info: Any = None) -> Tuple[Comm, Any]:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Idup`` (``(comm, request)``), on pycoll. The duplicate is complete on return
        (making its team is collective and blocking): the request is ``MPI.REQUEST_NULL``."""
        comm, request = self.comm.Idup() if info is None else self.comm.Idup(info)
        request.Wait()
        return self.derived(comm), MPI.REQUEST_NULL

    def Split(self, color: int = 0, key: int = 0) -> Any:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Split``, on pycoll (``MPI.UNDEFINED`` color: ``MPI.COMM_NULL``)."""
        return self.derived(self.comm.Split(color, key))

    def Split_type(self, split_type: int, key: int = 0, info: Any = None) -> Any:  # noqa: N802
        """mpi4py's ``Split_type`` (e.g. ``MPI.COMM_TYPE_SHARED``: the ranks of this host), on pycoll."""
        kw = {} if info is None else {"info": info}
        return self.derived(self.comm.Split_type(split_type, key, **kw))

    def Create(self, group: Any) -> Any:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Create``, on pycoll (``MPI.COMM_NULL`` off the group)."""
        return self.derived(self.comm.Create(group))

    def Create_group(self, group: Any, tag: int = 0) -> Any:  # noqa: N802 - mpi4py's name
        """mpi4py's ``Create_group`` (collective over the group only), on pycoll."""
        return self.derived(self.comm.Create_group(group, tag))

    def Create_intercomm(self, local_leader: int, peer_comm: Any, remote_leader: int,  # noqa: N802
                         tag: int = 0) -> Any:
        """mpi4py's ``Create_intercomm``: an intercommunicator (collectives by MPI, see
        :mod:`pycoll.mpi_inter`)."""
        peer = getattr(peer_comm, "comm", peer_comm)
        return self.derived(self.comm.Create_intercomm(local_leader, peer, remote_leader, tag))

    def Free(self) -> None:  # noqa: N802 - mpi4py's name
        """Free the communicator (mpi4py's ``Free``; collective, as MPI's), then close the team (its
        shared memory and its duplicate of the communicator)."""
        self.comm.Free()  # (first: MPI refuses to free COMM_WORLD, and then nothing changed)
        self.recent.clear()  # (a repeated call would otherwise find its persistent form)
        self.team.close()

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.team.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.team.size

    def arguments(self, row: Collective, values: Dict[str, Any],
                  copies: Optional[list] = None) -> Dict[str, Any]:
        """The keyword arguments of ``team.<row.name>`` for mpi4py's ``values`` (by MPI parameter
        name): buffer specifications become typed arrays (vector ones also give their counts and
        displacements), ``MPI.IN_PLACE`` and root-only buffers off the root become None, an MPI
        counts argument given as None is every rank's receive-buffer size (as mpi4py). An
        in-place input sent from a copy is recorded in ``copies`` (see :func:`in_place_copy`)."""
        kw: Dict[str, Any] = {}
        rank = self.team.rank
        root = values.get("root", 0)
        for p in row.mpi_params:
            v = values[p]
            if p not in _BUFFERS:
                name = row.mpi_rename.get(p, p)
                if v is None and p.endswith("counts"):  # (MPI's buffer Allgather: the lowercase one pickles)
                    v = np.empty(self.team.size, np.int64)
                    self.team.comm.Allgather(np.array([kw["recvbuf"].size], np.int64), v)
                    v = v.tolist()
                kw[name] = list(v) if p.endswith("counts") else v
            elif v is None or v is MPI.IN_PLACE or (p in row.root_only and rank != root):
                kw[p] = None
            elif p in row.mpi_vector:
                kw[p], counts, displs = as_vbuffer(v, self.team.size, writable=p != "sendbuf", what=p)
                c, d = row.mpi_vector[p]
                kw[c], kw[d] = counts, displs
            else:
                role = row.send if p == "sendbuf" else row.recv if p == "recvbuf" else ""
                if role == "block" and row.mpi_in_place == "copy" and kw.get("sendbuf", 0) is None:
                    role = "blocks"  # (in place, the receive buffer holds the whole input)
                # a count there is one block's; Reduce_scatter's (blocks of several counts) is the whole
                blocks = self.team.size if role == "blocks" and not row.vector else 0
                kw[p] = as_buffer(v, blocks=blocks, writable=p != "sendbuf", what=p)
        if "sendbuf" in kw and kw["sendbuf"] is None:
            if row.mpi_in_place == "swap":
                kw["sendbuf"], kw["recvbuf"] = kw["recvbuf"], None  # pycoll's in place: (buffer, None)
            elif row.mpi_in_place == "copy":
                in_place_copy(row, kw, self.team.rank, self.team.size, copies)
        return kw

    def __repr__(self) -> str:
        return f"<pycoll.mpi.Comm rank {self.rank}/{self.size} over {self.comm!r}>"


# ---------------------------------------------------------------------- methods from the table
def _bind(row: Collective, args: tuple, kw: Dict[str, Any]) -> Dict[str, Any]:
    """mpi4py's arguments by parameter name (taken out of ``kw``; what stays are pycoll's keywords,
    with the row's default algorithm for mpi4py callers added)."""
    params = row.mpi_params
    if len(args) > len(params):
        raise TypeError(f"{row.mpi}() takes {len(params)} positional arguments, {len(args)} given")
    values = dict(zip(params, args))
    for p in params[len(args):]:
        if p in kw:
            values[p] = kw.pop(p)
        elif p in _DEFAULTS:
            values[p] = _DEFAULTS[p]
        else:
            raise TypeError(f"{row.mpi}() missing required argument {p!r}")
    return values


# The blocking and non-blocking forms are made from source text (as pycoll.team's methods): mpi4py's
# parameters by name, and a call that repeats the last one's arguments (the same objects; ndarrays
# of the same dtypes) checked inline and run as a start of its persistent form.
_BLOCKING = """
def {name}(self, {params}**kw):
    given = ({args})  # (what the caller passed: kept in place should the collective fail)
    try:
{canon}        entry = self.recent.get(({name!r}, {first}))
        if entry is not None and not ({same}True):
            entry = entry.other  # (the call before, with other arguments)
            if entry is not None and not ({same}True):
                entry = None
        req = None
        if entry is not None and not kw:
            lane = entry.lane
            req = lane.run() if lane is not None else None
            if req is None:
                req = entry.again()
        if req is None:
            req = post(self, {name!r}, ({args}), kw)
    except PycollError as exc:
        raise mpi_error(exc) from None
    try:
        req.wait()
    except PycollError as exc:
        keep_failed(hold_all(given))  # (its collective may still be in flight)
        raise mpi_error(exc) from None
    except BaseException:  # (interrupted: the collective goes on)
        keep_failed(hold_all(given))
        raise
"""
_NONBLOCKING = """
def {name}(self, {params}**kw):
    try:
        held = None
{canon}        entry = self.recent.get(({name!r}, {first}))
        if entry is not None and not ({same}True):
            entry = entry.other  # (the call before, with other arguments)
            if entry is not None and not ({same}True):
                entry = None
        if entry is not None and not kw:
            lane = entry.lane
            req = lane.run() if lane is not None else None
            if req is None:
                req = entry.again()
            if req is not None:
                return Request(req, held)
        return Request(post(self, {name!r}, ({args}), kw), held)
    except PycollError as exc:
        raise mpi_error(exc) from None
"""
#: A buffer argument that is not an ndarray, made canonical (:class:`pycoll.mpispec.Specs`); the
#: non-blocking form also holds an export of its memory until the call is done (as mpi4py's).
_CANON = """        if type({p}) not in _CANONICAL:
            {p} = self.specs.canon({p})
"""
_CANON_HELD = """        if type({p}) not in _CANONICAL:
            held = hold(held, {p})
            {p} = self.specs.canon({p})
"""
#: Buffer arguments that are canonical as they are: arrays, None, MPI.IN_PLACE.
_CANONICAL = frozenset((np.ndarray, type(None), type(MPI.IN_PLACE)))
#: Arguments that are the same whenever they are the same object (for the others, see
#: :func:`pycoll.persistent.buffer_dtype`).
_CONSTANT = (type(None), int, MPI.Op, MPI.Datatype, type(MPI.IN_PLACE), Spec)


def argument_key(arg: Any, param: str = "") -> Any:
    """What a repeated call is recognised by besides an argument's identity: None for constants
    (ints, None, MPI ops, datatypes and IN_PLACE), else :func:`pycoll.persistent.buffer_dtype`
    (the dtype of an ndarray buffer; never a repeat for other objects, nor for counts other than
    None, whose values may change in place)."""
    if type(arg) in _CONSTANT:
        return None
    return UNSTABLE if param.endswith("counts") else buffer_dtype(arg)


def _persistent(team: Team, init: str, kwargs: Dict[str, Any]) -> Persistent:
    """The persistent form of a repeated call: ``team.<coll>_init(**kwargs)``."""
    return getattr(team, init)(**kwargs)


def _mpi_methods(row: Collective) -> Dict[str, Callable[..., Any]]:
    """mpi4py's ``X``, ``IX`` and ``X_init`` of one collective."""
    coll, init = row.name, f"{row.name}_init"

    def post(self: Comm, method: str, args: tuple, kw: Dict[str, Any]) -> Any:
        """Convert mpi4py's arguments and post the call of ``method`` as a new one; remember it.
        A reduction of a type pycoll cannot reduce goes to MPI instead (see :func:`unreduced`)."""
        try:
            values = _bind(row, args, kw)
            if handed(row, method, values) or foreign_op(method, values):
                return Handed(getattr(self.comm, method)(*(values[p] for p in row.mpi_params)))
            kwargs = self.arguments(row, values)
            if "op" in values and unreduced(method, kwargs):
                return Handed(getattr(self.comm, method)(*(values[p] for p in row.mpi_params)))
            req = getattr(self.team, coll)(**kwargs, **kw)
        except ARGUMENT_ERRORS as exc:
            raise self.rejected(method, exc, coll) from None
        # (counts given as None are gathered from every rank on every call, and an in-place copy
        # is made on every call: never a repeat)
        if not kw and not any(v is None for p, v in values.items() if p.endswith("counts")) and \
                not (row.mpi_in_place == "copy" and values.get("sendbuf") is MPI.IN_PLACE):
            key = repeat_key(method, args)
            if self.recent.admits(key, args):
                dtypes = tuple(map(argument_key, args, row.mpi_params))
                self.recent.add(key, args, dtypes, _persistent, self.team, init, kwargs)
        return req

    def persistent(self: Comm, *args: Any, **kw: Any) -> Any:
        values = _bind(row, args, kw)
        held = None  # (exports of the buffers' memory, held while the Prequest lives: as mpi4py's)
        for p in _BUFFERS.intersection(values):
            if type(values[p]) is not np.ndarray:
                held = hold(held, values[p])
                values[p] = self.specs.canon(values[p])
        if handed(row, f"{row.mpi}_init", values) or foreign_op(f"{row.mpi}_init", values):
            # (MPI's own Prequest, with every MPI argument)
            return getattr(self.comm, f"{row.mpi}_init")(*(values[p] for p in row.mpi_params))
        copies: list = []
        kwargs = self.arguments(row, values, copies)
        if "op" in values and unreduced(f"{row.mpi}_init", kwargs):
            return getattr(self.comm, f"{row.mpi}_init")(*(values[p] for p in row.mpi_params))
        try:
            return Prequest(getattr(self.team, init)(**kwargs, **kw), copies, held)
        except PycollError as exc:
            raise mpi_error(exc) from None

    names = row.mpi_params
    namespace: Dict[str, Any] = {"post": post, "Request": Request, "PycollError": PycollError,
                                 "mpi_error": mpi_error, "_CANONICAL": _CANONICAL, "hold": hold,
                                 "hold_all": hold_all, "keep_failed": keep_failed}
    params = []
    for p in names:
        if p in _DEFAULTS:
            namespace[f"_default_{p}"] = _DEFAULTS[p]
            params.append(f"{p}=_default_{p}, ")
        else:
            params.append(f"{p}, ")
    fields = {"params": "".join(params), "args": "".join(f"{p}, " for p in names),
              "first": f"id({names[0]})" if names else "0",  # see persistent.repeat_key
              "same": "".join(f"entry.args[{i}] is {p} and (entry.dtypes[{i}] is None or ({p}.dtype is "
                              f"entry.dtypes[{i}] and {p}.flags.num == entry.flags[{i}])) and "
                              for i, p in enumerate(names))}
    iname = f"I{row.mpi[0].lower()}{row.mpi[1:]}"
    buffers = [p for p in names if p in _BUFFERS]
    canon = "".join(_CANON.format(p=p) for p in buffers)
    canon_held = "".join(_CANON_HELD.format(p=p) for p in buffers)
    exec(_BLOCKING.format(name=row.mpi, canon=canon, **fields)
         + _NONBLOCKING.format(name=iname, canon=canon_held, **fields),
         namespace)  # our own template, our own names
    blocking, istart = namespace[row.mpi], namespace[iname]

    sig_params = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=_DEFAULTS.get(p, inspect.Parameter.empty)) for p in names]
    sig = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *sig_params,
                             inspect.Parameter("kw", inspect.Parameter.VAR_KEYWORD)])
    made = {row.mpi: (blocking, "blocking"), iname: (istart, "non-blocking"),
            f"{row.mpi}_init": (persistent, "persistent")}
    out = {}
    for name, (fn, kind) in made.items():
        fn.__name__, fn.__qualname__, fn.__module__ = name, f"Comm.{name}", __name__
        fn.__doc__ = f"mpi4py's ``{name}`` ({kind} {row.name}) on pycoll: {row.doc}"
        fn.__signature__ = sig
        out[name] = fn
    return out


for _row in TABLE:
    if _row.mpi:
        for _name, _fn in _mpi_methods(_row).items():
            setattr(Comm, _name, _fn)
del _row
