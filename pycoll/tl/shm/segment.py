"""The shared-memory segment of a team whose ranks share a host.

The segment is an anonymous ``memfd`` (mode 0600) created by rank 0; the other ranks open it
through ``/proc/<pid>/fd/<fd>`` (allowed only to the same user) and map it. It never has a name in
``/dev/shm``, so nothing is left behind whatever happens to the ranks, SIGKILL included; the memory
goes away when the last rank unmaps it.

Collectives on the segment (allreduce, bcast, barrier, reduce, allgather(v), reduce_scatter(v),
gather(v), scatter(v), alltoall(v)) are native state machines (``native/shm.c``): each call
advances one as far as it can without blocking and returns, so the engine keeps running other
work. They run one at a time, in the order the team's ranks posted them (tickets handed out at call
time), and every step re-validates the segment header. A rank that waits checks every
``LIVENESS_S`` that its peers' processes still exist, and may sleep in the kernel on the flag it
waits for (:meth:`ShmSegment.sleep`): the peer that sets it wakes it.
"""

from __future__ import annotations

import mmap
import os
import socket
import time
from typing import Any, Callable, List, Optional, Set, Tuple

import numpy as np

from pycoll import config
from pycoll.calls import REJECTED
from pycoll.dtypes import DTYPE_CODES
from pycoll.errors import MismatchError, PeerLostError, RevokedError, TransportError
from pycoll.ops import OP_CODES
from pycoll.tl.shm import mapped
from pycoll.tl.shm.leaving import (
    LEFT_CLOSED,
    LEFT_EXITED,
    LEFT_FAILED,
    LEFT_MISMATCH,
    LEFT_RAISED,
    LEFT_REVOKED,
    LEFT_TEXT,
    LEFT_WHY_BYTES,
    unwatch,
    watch,
)

LIVENESS_S = 0.05
#: How long a team that closes waits for the roots of the gathers it went on from without them to
#: sign those (to compare their calls with its own), at most; past it, it closes unchecked.
SETTLE_S = 1.0
#: Bytes of one slot (a rank's share of a chunk in flight); chunks of a collective are this big.
DEFAULT_SLOT_BYTES = 1 << 20
#: A collective's phase while it checks the ranks' signatures after its last generation
#: (PC_PHASE_VERIFY in native/shm.c).
PHASE_VERIFY = 99
#: The largest block of a single-copy scatter(v) or alltoall(v) that goes through the sender's slot
#: (a copy in and one out) rather than being read from its memory, where the single copy is fast
#: and where it is slow (``cma_slow``). Measured on 8 and 16 ranks of a 16-core x86 server: the
#: single copy wins from blocks of 8-16 KiB (docs/selection.md). On two ranks where it is slow, every
#: block that fits the slot goes through it (``ShmSegment.cma_inline_bytes``).
CMA_INLINE_BYTES = {False: 8 << 10, True: 64 << 10}
#: Flag polls per native progress call before it returns to the engine.
POLLS_PER_CALL = 4000
#: The fewest a call halves down to while the peers keep it waiting (see ShmSegment.progress).
MIN_POLLS_PER_CALL = 64
#: The native error of a failed read of a peer's memory (PC_ECMA).
CMA_FAILED = -6
#: ``PYCOLL_CHECK`` -> the native state's ``check`` (``PC_CHECK_*``): whose signatures the other
#: ranks of a rooted collective wait for (``native/shm.c``, ``checks_every_rank``)
CHECK_CODES = {"on": 0, "all": 1, "off": 2}
#: The native errors of ranks whose blocks' sizes (PC_EDISAGREE) or signatures of a collective
#: (PC_EMISMATCH) differ, and of a rank whose earlier gather, which it went on from without the
#: root (eager), differs from the root's (PC_EMISMATCH_EARLIER).
DISAGREE, MISMATCH, MISMATCH_EARLIER = -5, -7, -9

(COLL_ALLREDUCE, COLL_BCAST, COLL_BARRIER, COLL_REDUCE, COLL_ALLGATHER, COLL_REDUCE_SCATTER, COLL_GATHER,
 COLL_SCATTER, COLL_ALLTOALL, COLL_BCAST_CMA, COLL_GATHER_CMA, COLL_SCATTER_CMA,
 COLL_ALLTOALL_CMA, COLL_ALLREDUCE_MAPPED, COLL_SCAN, COLL_EXSCAN, COLL_ALLREDUCE_CMA) = range(17)
#: The collectives' names by native code.
COLL_NAMES = ("allreduce", "bcast", "barrier", "reduce", "allgather", "reduce_scatter", "gather", "scatter",
              "alltoall", "bcast (single copy)", "gather (single copy)", "scatter (single copy)",
              "alltoall (single copy)", "allreduce (arrays of team.alloc)", "scan", "exscan",
              "allreduce (single copy)")
_DTYPE_NAMES = {code: str(dt) for dt, code in DTYPE_CODES.items()}
_OP_NAMES = {code: op.name.lower() for op, code in reversed(OP_CODES.items())}  # SUM, not AVG
_OP_NAMES[0xfe] = "avg"  # PC_SIG_AVG: an average reduces as SUM, its signature says AVG


def describe_signature(what: int, count: int, agree: int = 0) -> str:
    """A rank's call as its signature says it (``allreduce 100 x float32 sum``, ``bcast 8 x int64
    root 1``, ``barrier``, or a call the rank rejected: see :data:`pycoll.calls.REJECTION`)."""
    coll, dtype, op, root = what & 0xff, (what >> 8) & 0xff, (what >> 16) & 0xff, what >> 32
    if coll == COLL_BARRIER and agree == REJECTED:
        return "a call it rejected (its arguments failed its own checks)"
    text = COLL_NAMES[coll] if coll < len(COLL_NAMES) else f"collective {coll}"
    if coll in (COLL_GATHER, COLL_GATHER_CMA) and not agree >> 63:
        text = text.replace("gather", "gatherv", 1)  # (a gather signs its block size, marked; a gatherv not)
    if coll != COLL_BARRIER:
        text += f" {count} x {_DTYPE_NAMES.get(dtype, f'dtype {dtype}')}"
    if op != 0xff:
        text += f" {_OP_NAMES.get(op, f'op {op}')}"
    if root != 0xffffffff:
        text += f" root {root}"
    return text


def shm_available() -> bool:
    """Whether this platform can make segments (Linux memfd and the native module)."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return False
    try:
        import pycoll.native  # noqa: F401, PLC0415 - optional: the native build (pycoll._native)
    except Exception:
        return False
    return True


def _zombie(pid: int) -> bool:
    """Whether process ``pid`` has exited but was not reaped yet (its state in /proc is Z)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    end = stat.rfind(b")")
    return end >= 0 and stat[end + 2:end + 3] in (b"Z", b"X")


def cause_order(left: int) -> int:
    """Where a peer that left in way ``left`` (LEFT_*, 0: its process died) comes among the causes
    of a failure: one that died or raised first, then one that failed (maybe because of it), then
    one that exited or closed its team (maybe after failing)."""
    return 0 if left in (0, LEFT_RAISED) else 1 if left in (LEFT_FAILED, LEFT_REVOKED, LEFT_MISMATCH) else 2


class ShmSegment:
    """rank ``rank`` of ``size``'s mapping of the team's segment.

    ``allgather(bytes) -> list[bytes]`` is the team's bootstrap exchange (MPI or store); it is
    called twice, collectively.
    """

    def __init__(self, rank: int, size: int, allgather: Callable[[bytes], List[bytes]],
                 slot_bytes: Optional[int] = None) -> None:
        from pycoll.native import ERRORS, ffi, lib  # noqa: PLC0415 - optional: the native build

        if slot_bytes is None:
            slot_bytes = DEFAULT_SLOT_BYTES  # read at call time: tests make it small

        self.ffi, self.lib, self.errors = ffi, lib, ERRORS
        self.rank, self.size = rank, size
        layout = ffi.new("pc_shm_header_t *")
        total = lib.pycoll_shm_layout(size, slot_bytes, layout)
        if not total:
            raise TransportError(f"shm: cannot lay out a segment for {size} ranks with {slot_bytes} B slots")
        fd = -1
        error = ""
        try:
            if rank == 0:
                fd = os.memfd_create("pycoll-shm", os.MFD_CLOEXEC)
                os.fchmod(fd, 0o600)
                os.ftruncate(fd, total)
                info = f"{os.getpid()}:{fd}:{total}".encode()
            else:
                info = b""
            infos = allgather(info)
            pid, cfd, total = (int(x) for x in infos[0].decode().split(":"))
            if rank != 0:
                try:
                    fd = os.open(f"/proc/{pid}/fd/{cfd}", os.O_RDWR | os.O_CLOEXEC)
                except OSError as exc:
                    error = f"rank {rank} cannot open rank 0's segment: {exc}"
            if not error:
                self.mm = mmap.mmap(fd, total)
                self.total = total
                self.base = ffi.from_buffer(self.mm)
                if rank == 0:
                    layout.creator_pid = os.getpid()
                    lib.pycoll_shm_init(self.base, total, layout)
        finally:
            if fd >= 0 and rank != 0:
                os.close(fd)
        # everyone has mapped it (or said why not); rank 0 then closes the only descriptor
        states = allgather(error.encode())
        if rank == 0 and fd >= 0:
            os.close(fd)
        problems = [s.decode() for s in states if s]
        if problems:
            self.mm = None
            raise TransportError("shm: " + "; ".join(problems))
        rc = lib.pycoll_shm_check(self.base, self.total, size)
        if rc:
            raise TransportError(f"shm: {ERRORS.get(rc, rc)}")
        self._pid = os.getpid()  # (a forked child never speaks for this rank)
        watch(self)
        lib.pycoll_shm_attach(self.base, rank, os.getpid())
        allgather(b"attached")
        self.pids = [int(lib.pycoll_shm_load(self.base, r, 3)) for r in range(size)]
        self.slot_bytes = slot_bytes
        self._gen = ffi.new("uint64_t *", 1)  # generation of the next chunk (equal on every rank)
        self._run = lib.pycoll_shm_run
        self.tickets = 0  # collectives handed out, in call order
        self.turn = 0  # the ticket that may run now
        self.broken: Optional[BaseException] = None
        #: Called with the :class:`RevokedError` when a peer's revoke is found here (the team
        #: revokes itself: its later calls raise at once).
        self.on_revoked: Optional[Callable[[BaseException], None]] = None
        #: Whether the ranks may read each other's memory (process_vm_readv); set by the team.
        self.cma = False
        #: Whether such a read costs more than two in-cache copies of the same bytes on this
        #: machine (measured by every rank when the team is made, agreed: the median); set by
        #: the team. The selection then keeps the segment where the single copy does not pay.
        self.cma_slow = False
        #: Blocks of the single-copy scatter(v) and alltoall(v) up to this many bytes travel
        #: through the sender's slot instead (None: :data:`CMA_INLINE_BYTES` by the copy's speed);
        #: read when a collective's native state is made.
        self.cma_inline: Optional[int] = None
        self._polls = POLLS_PER_CALL
        self._check = CHECK_CODES[config.get("PYCOLL_CHECK")]
        #: Yield the core every this many polls of a flag not ready (0: spin); set before the
        #: first collective, for ranks that outnumber the cores (see :meth:`oversubscribed`).
        self.yield_every = 0
        #: The flag polls of the next native call, at most :attr:`polls` (halved while the peers
        #: keep this rank waiting, doubled again when they do not).
        self.budget = POLLS_PER_CALL
        self._next_check = 0.0  # check_peers() runs again after this time (monotonic)
        #: The memory the team allocated for its ranks to share (``team.alloc``), while mapped.
        self.regions: List[mapped.Region] = []

    # ------------------------------------------------------------------ collectives
    @property
    def polls(self) -> int:
        """The most flag polls of one native call before it returns to the engine."""
        return self._polls

    @polls.setter
    def polls(self, polls: int) -> None:
        self._polls = polls
        self.budget = min(self.budget, polls)

    @property
    def next_gen(self) -> int:
        """The generation the next collective on the segment starts at (equal on every rank)."""
        return int(self._gen[0])

    @property
    def signed(self) -> int:
        """How many collectives this rank has signed on the segment (each one that moves data or
        synchronizes); the next one it signs is number ``signed + 1`` (``PYCOLL_CHECK=auto`` counts
        these)."""
        out = self.ffi.new("uint64_t[5]")
        found = self.lib.pycoll_shm_last(self.base, self.total, self.size, self.rank, out)
        return int(out[0]) if found == 1 else 0

    def ticket(self) -> int:
        """A place in the segment's order for a new collective (called when it is posted)."""
        t = self.tickets
        self.tickets += 1
        return t

    def new_state(self, coll: int, op: int = 0, dtype: int = 0, root: int = 0) -> Any:
        """The native state of one collective of this kind (reused call after call)."""
        st = self.ffi.new("pc_shm_coll_t *")
        st.base, st.mapped, st.rank, st.nranks = self.base, self.total, self.rank, self.size
        st.coll, st.op, st.dtype, st.root = coll, op, dtype, root
        st.yield_every = self.yield_every
        st.check = self._check
        st.inline_max = self.cma_inline_bytes()
        return st

    def cma_inline_bytes(self) -> int:
        """The largest block of a single-copy scatter(v) or alltoall(v) that goes through the
        sender's slot: ``cma_inline`` if set, else :data:`CMA_INLINE_BYTES` by the copy's speed, but
        on two ranks where the single copy is slow every block that fits (the one block that
        travels is copied once in and once out, where the root of more ranks would copy every
        block in turn while its readers wait: 2-core VM, scatterv 256 KiB 10.2-10.7 -> 4.3-4.6 us,
        1 MiB 36-37 -> 18-20 us; alltoallv 12.3-12.6 -> 6.5-6.9 and 47-49 -> 30-31 us; on 8 ranks a
        1 MiB scatterv went 64 -> 82 us; docs/selection.md)."""
        if self.cma_inline is not None:
            return self.cma_inline
        if self.cma_slow and self.size == 2:
            return self.slot_bytes
        return CMA_INLINE_BYTES[self.cma_slow]

    def start(self, st: Any, src: np.ndarray, dst: np.ndarray, buffers_changed: bool) -> None:
        """Point ``st`` at a collective starting at the segment's next generation (a field of the
        native state is written only when it changes: each write costs a conversion)."""
        if buffers_changed:
            st.src = self.ffi.cast("const char *", self.ffi.from_buffer(src))
            st.dst = self.ffi.cast("char *", self.ffi.from_buffer(dst))
            st.count = dst.size
            st.nchunks = self.lib.pycoll_shm_chunks(st)
        gen = self._gen[0]
        if st.gen != gen:  # the same state ran the segment's last collective: it ends there
            st.gen = gen
        st.chunk = 0
        if st.phase:  # a finished collective leaves phase 0, but for a barrier
            st.phase = 0

    def progress(self, st: Any, waited_since: float) -> bool:
        """Advance ``st``; True once done. Raises TransportError on a bad segment or a dead peer.

        ``waited_since``: when the collective first found its peers missing (``time.monotonic()``);
        0.0 for the first call after :meth:`start` (it has not waited: no liveness check yet)."""
        if self.broken is not None:
            raise self.broken
        polls, budget = self._polls, self.budget
        where = (st.chunk, st.phase) if waited_since else (0, 0)  # (0, 0): as start left it
        rc = self.lib.pycoll_shm_progress(st, budget)
        if rc == 1:
            if budget < polls:
                self.budget = budget * 2 if budget * 2 < polls else polls
            self._gen[0] = st.gen
            self.turn += 1
            return True
        if rc < 0:
            self.raise_native(rc)
        # The peers were not there within the budget: they may be waiting for this core (other
        # processes keep the others busy). Spin less before going back to the engine (which
        # yields); a call that finishes at once doubles the budget again, up to ``polls``. A call
        # that moved on (a large collective, chunk by chunk) keeps the whole budget.
        if (st.chunk, st.phase) != where:
            self.budget = polls
        elif budget > MIN_POLLS_PER_CALL:
            self.budget = budget // 2
        if waited_since and time.monotonic() - waited_since > LIVENESS_S:
            self.check_peers(st)
        return False

    def oversubscribed(self) -> None:
        """The team's ranks on this host outnumber its cores: a rank whose peers are not there
        yields its core inside the native wait (every 8 polls) so the ones it waits for run, and
        returns to the engine after fewer polls."""
        self.yield_every = 8
        self.polls = 256

    def free(self) -> bool:
        """Whether every collective posted on the segment has finished (one posted now runs at
        once) and the segment is usable."""
        return self.turn == self.tickets and self.broken is None

    def run(self, st: Any) -> bool:
        """Post ``st`` (bound to its buffers by an earlier :meth:`start`) as the segment's next
        collective and advance it, in one native call: a collective run again on the same
        buffers, for a caller that found the segment :meth:`free`. True when done (it took and
        gave back its place in the order at once); False when it waits for peers: it holds its
        place (a ticket) and :meth:`progress` goes on from where it stopped. Raises
        TransportError as :meth:`progress`."""
        return self.ran(self._run(st, self._gen, self.budget))

    def express_call(self) -> Tuple[Callable[[Any, Any, int], int], Any]:
        """``(run, gen)``: the native call of :meth:`run` and the segment's generation cell, for
        the engine's express lane (:class:`pycoll.engine.express.ExpressLane`), which calls
        ``run(st, gen, budget)`` itself, inline, after finding the segment free (``turn ==
        tickets``, ``broken`` None), with :attr:`budget`. It returns 1 when the collective is
        done; any other result goes to :meth:`ran` (through the task's ``express_started``)."""
        return self._run, self._gen

    def ran(self, rc: int) -> bool:
        """Take the result of :meth:`run`'s native call: True when done; False when the
        collective waits for peers (it holds its ticket now); raises TransportError (and the
        segment is broken) when the call failed."""
        if rc == 1:
            return True
        if rc < 0:
            self.raise_native(rc)
        self.tickets += 1
        return False

    def raise_native(self, rc: int) -> None:
        """Raise the error of a native call that returned ``rc`` < 0 (the segment is broken from
        now on). A peer's memory that cannot be read usually means the peer has died: then the
        error names it."""
        if rc == CMA_FAILED:
            self.check_peers(now=True)
        raise self.native_error(rc)

    def native_error(self, rc: int) -> BaseException:
        """The error of a native call that returned ``rc`` < 0 (TransportError, MismatchError
        where the ranks' calls differ), to raise: the segment is broken from now on."""
        if rc == MISMATCH:
            return self.broke(MismatchError(self.mismatch()))
        if rc == DISAGREE:
            return self.broke(MismatchError(self.mismatch(sizes=True)))
        if rc == MISMATCH_EARLIER:
            gen0 = int(self.lib.pycoll_shm_load(self.base, self.rank, 5))
            return self.broke(MismatchError(
                f"an earlier gather's calls differ (found by rank {self.rank}, which went on from it "
                f"without waiting for the root): {self.mismatch(gen0=gen0)}"))
        return self.broke(TransportError(f"shm: {self.errors.get(rc, rc)}"))

    def mismatch(self, sizes: bool = False, gen0: Optional[int] = None) -> str:
        """What each rank called in the collective in progress (its signature in the segment), side
        by side: the text of a :class:`MismatchError`. ``sizes``: the ranks disagree on the sizes
        of the blocks (a v-collective's counts), not on the call. ``gen0``: the first generation
        of another collective than the one in progress."""
        gen0, out = self._gen[0] if gen0 is None else gen0, self.ffi.new("uint64_t[3]")
        calls = []
        for r in range(self.size):
            rc = self.lib.pycoll_shm_sig(self.base, self.total, self.size, r, gen0, out)
            if rc == 1:
                calls.append(describe_signature(out[0], out[2], out[1]))
            elif self.lib.pycoll_shm_load(self.base, r, 0) >= gen0:  # (its flag is past it: went_past)
                calls.append("none began at this generation (its calls before took others)")
            else:
                calls.append("not there yet")
        side_by_side = "; ".join(f"rank {r}: {call}" for r, call in enumerate(calls))
        if sizes:
            return ("the ranks disagree on the sizes of the blocks (the counts) of this collective: a rank "
                    f"sends another a block of a size that one does not expect ({side_by_side})")
        alike = len(set(calls)) == 1
        return (f"the ranks' calls of the collective at generation {gen0} of the shared segment differ"
                + (" in the counts every rank must give alike: " if alike else ": ") + side_by_side
                + " (every rank must call the same collectives in the same order, with the same count, "
                "dtype, op and root)")

    def fail(self, error: BaseException) -> None:
        """A collective on the segment stopped halfway: the segment's state is unknown now."""
        if self.broken is None:  # keep the first cause (later failures are its consequences)
            self.broke(TransportError(f"shm: the segment is unusable after an earlier failure: {error}"),
                       why=str(error))

    def broke(self, error: BaseException, why: Optional[str] = None) -> BaseException:
        """The segment is unusable from now on because of ``error`` (returned, to be raised): the
        peers are told at once (this rank left, "failed: <why>", ``why`` by default the error's
        text; 47 bytes reach them), so that those waiting for it raise :class:`PeerLostError`
        with the cause instead of waiting for the timeout."""
        self.broken = error
        how = LEFT_MISMATCH if isinstance(error, MismatchError) else LEFT_FAILED
        self.leave(how, (str(error) if why is None else why).removeprefix("shm: "))
        return error

    def waiting_for(self, st: Any) -> str:
        """What the collective of state ``st`` (started, not finished) waits for, peer by peer,
        for a timeout's message: who has not entered it yet and what each one's last collective
        on the segment was, or where the others are. E.g. ``collective #42 on the segment, chunk
        0/1 (generation 57): rank 1 has not entered it (its last: #41, bcast 8 x float32 root 0)``."""
        out = self.ffi.new("uint64_t[5]")
        sig = self.ffi.new("uint64_t[3]")
        load = self.lib.pycoll_shm_load
        where = (f"collective #{st.seq} on the segment" if st.seq else "a collective on the segment") + \
            f", chunk {st.chunk}/{st.nchunks} (generation {st.gen})"
        root = st.wait_rank
        if st.seq and st.phase == PHASE_VERIFY and root < self.size and st.wait_gen != st.gen0:
            # (done but for the check it owes of an earlier gather it went on from without the root)
            return (f"{where}: done, but for the check of an earlier gather (generation {st.wait_gen}) "
                    f"this rank went on from without its root: rank {root}, the root, has not entered "
                    f"that gather (its last: {self._last_call(root, out)})")
        peers = []
        for r in range(self.size):
            if r == self.rank:
                continue
            signed = st.seq and self.lib.pycoll_shm_sig(self.base, self.total, self.size, r, st.gen0,
                                                        sig) == 1
            if signed or not st.seq:  # (a collective that signs nothing: the flags say it all)
                arrive, reduced = int(load(self.base, r, 0)), int(load(self.base, r, 1))
                if min(arrive, reduced) < st.gen:
                    peers.append(f"rank {r} is in it, at generation {arrive}/{reduced} (arrive/reduced)")
                continue
            peers.append(f"rank {r} has not entered it (its last: {self._last_call(r, out)})")
        return where + (": " + "; ".join(peers) if peers else ": every peer is there")

    def _last_call(self, r: int, out: Any) -> str:
        """Rank ``r``'s last collective on the segment as its signature says it (``#41, bcast 8 x
        float32 root 0``; "none"); ``out``: a ``uint64_t[5]``."""
        if self.lib.pycoll_shm_last(self.base, self.total, self.size, r, out) == 1:
            return f"#{out[0]}, {describe_signature(out[1], out[2], out[4])}"
        return "none"

    def flags(self) -> str:
        """Every rank's (arrive, reduced) generations, for diagnostics."""
        load = self.lib.pycoll_shm_load
        return ", ".join(f"rank {r}: {load(self.base, r, 0)}/{load(self.base, r, 1)}"
                         for r in range(self.size))

    def check_peers(self, st: Any = None, now: bool = False) -> None:
        """Raise :class:`PeerLostError` if a peer this rank waits for has left: its process is
        gone (or a zombie nobody has reaped yet), or it said it left (exited, raised, closed the
        team; its process may live on inside MPI_Finalize); at most once per ``LIVENESS_S``.
        With the state ``st`` of the collective that waits, a peer that left only counts if it
        did not reach that collective's current generation (one that finished its part and left
        is not waited for); without, any peer that left counts. ``now``: check even if the last
        check was less than ``LIVENESS_S`` ago."""
        t = time.monotonic()
        if t < self._next_check and not now:
            return
        self._next_check = t + LIVENESS_S
        load = self.lib.pycoll_shm_load
        lost = []  # (first cause first, rank, pid, how)
        for r, pid in enumerate(self.pids):
            if r == self.rank:
                continue
            left, how = self.whereabouts(r)
            if how is None:
                continue
            # what this rank waits for: generation st.gen, or, once past its last generation and
            # checking the signatures (PC_PHASE_VERIFY), only that every rank signed its first
            need = None if st is None else st.gen0 if st.phase == PHASE_VERIFY else st.gen
            if need is not None and min(load(self.base, r, 0), load(self.base, r, 1)) >= need:
                continue  # it did its part of what this rank waits for
            # a rank that died or raised comes first, then one that failed (maybe because of it),
            # then one that exited or closed its team (maybe after failing)
            lost.append((cause_order(left), r, pid, how, left))
        if not lost:
            return
        lost.sort()
        waiting = ""
        if st is not None:
            name = COLL_NAMES[st.coll] if 0 <= st.coll < len(COLL_NAMES) else f"collective {st.coll}"
            waiting = f" while rank {self.rank} waited in {name} (generation {st.gen})"
        host = socket.gethostname()
        _, r, pid, how, left = lost[0]
        text = "; ".join(f"rank {r} (pid {p}, host {host}) {h}" for _, r, p, h, _ in lost)
        if left == LEFT_REVOKED:  # (this rank passes the revoke on, not a failure of its own)
            err = RevokedError(f"shm: {text}{waiting}", rank=r)
            self.revoke(err, f"rank {r} {how}")
            if self.on_revoked is not None:
                self.on_revoked(err)
            raise err from None
        if left == LEFT_MISMATCH:  # (the team's calls went out of step: this rank's too)
            mismatch = MismatchError(f"shm: {text}{waiting}")
            self.broken = mismatch
            if self.on_revoked is not None:
                self.on_revoked(mismatch)
            raise mismatch from None
        raise self.broke(PeerLostError(f"shm: {text}{waiting}", rank=r, pid=pid, how=how),
                         why=f"rank {r} {how}") from None

    def whereabouts(self, r: int) -> Tuple[int, Optional[str]]:
        """``(left, how)`` of rank ``r``: how it said it left (LEFT_*, 0 if it did not) and the
        words for it, or ``(0, None)`` while it is here (said nothing, process alive)."""
        left = int(self.lib.pycoll_shm_load(self.base, r, 4))
        if left:
            why = self.ffi.new("char[]", LEFT_WHY_BYTES)
            self.lib.pycoll_shm_left(self.base, r, why)
            text = self.ffi.string(why).decode(errors="replace")
            return left, LEFT_TEXT.get(left, f"left ({left})") + (f" {text}" if text else "")
        return (0, "has died") if self.dead(r) else (0, None)

    def dead(self, r: int) -> bool:
        """Whether rank ``r``'s process is gone (or a zombie nobody has reaped yet)."""
        pid = self.pids[r]
        try:
            os.kill(pid, 0)
            dead = _zombie(pid)
        except ProcessLookupError:
            dead = True
        except PermissionError:
            dead = False
        return dead

    def gone(self) -> Set[int]:
        """The ranks that left for good: dead, exited, raised or closed the team. Not those
        whose collective failed or that revoked the team while their process lives: they are
        there (to agree on what to do next, :mod:`pycoll.recovery`)."""
        if self.base is None:
            return set()
        return {r for r in range(self.size) if r != self.rank and self.left_for_good(r) is not None}

    def left_for_good(self, r: int) -> Optional[Tuple[int, str]]:
        """``(left, how)`` (see :meth:`whereabouts`) of rank ``r`` if it left for good (see
        :meth:`gone`), else None."""
        left, how = self.whereabouts(r)
        if how is not None and (left not in (LEFT_FAILED, LEFT_REVOKED, LEFT_MISMATCH) or self.dead(r)):
            return left, how
        return None

    def revoke(self, error: BaseException, why: str) -> None:
        """The team is revoked: unusable from now on (``error`` is what a collective posted on
        it raises), and the peers waiting on this rank raise :class:`RevokedError` at once."""
        if self.broken is None:
            self.broken = error
        self.leave(LEFT_REVOKED, why)

    def leave(self, how: int = LEFT_EXITED, why: str = "") -> None:
        """Say in the segment that this rank left (``how``: LEFT_*; ``why``: the exception's
        text), once: peers waiting for it raise :class:`PeerLostError` instead of timing out."""
        if getattr(self, "mm", None) is not None and self.base is not None \
                and os.getpid() == getattr(self, "_pid", None):
            text = why.encode(errors="replace")[:LEFT_WHY_BYTES - 1]
            self.lib.pycoll_shm_leave(self.base, self.rank, how, text)

    def sleep(self, st: Any, timeout_s: float) -> bool:
        """Sleep in the kernel until the flag ``st``'s last progress call waited for is set (the
        rank that sets it wakes this one) or ``timeout_s`` pass; True if it is set now. A rank
        that waits gives its core to the others this way and is back as soon as the peer is."""
        rc = self.lib.pycoll_shm_sleep(st, int(timeout_s * 1e9))
        if rc < 0:
            self.raise_native(rc)
        return bool(rc)

    # ------------------------------------------------------------------ shared arrays
    def allocate(self, shape: Any, dtype: np.dtype, exchange: Callable[[bytes], List[bytes]]) -> np.ndarray:
        """Collective: this rank's array of a new region every rank maps (see
        :mod:`pycoll.tl.shm.mapped`); ``exchange`` is the team's allgather of short texts."""
        arr, region = mapped.allocate(self.rank, self.size, shape, dtype, exchange)
        self.regions.append(region)
        return arr

    def regions_of(self, src: np.ndarray, dst: np.ndarray) -> Optional[Tuple[mapped.Region, mapped.Region]]:
        """The regions of :meth:`allocate` holding ``src`` and ``dst`` (contiguous, in this rank's
        part), or None when either lies elsewhere."""
        if not self.regions:
            return None
        a = mapped.find(self.regions, src)
        b = a if dst is src or a is None else mapped.find(self.regions, dst)
        return None if b is None else (a, b)

    def bind_regions(self, st: Any, regions: Tuple[mapped.Region, mapped.Region]) -> None:
        """Point the native state of a ``mapped`` collective at the regions of its buffers."""
        for k, region in enumerate(regions):
            st.region[k] = self.ffi.cast("char *", region.base)
            st.region_bytes[k] = region.part_bytes
            st.region_id[k] = region.ident

    def slot_offset(self, gen: int, rank: int, st: Any = None) -> int:
        """Where rank ``rank``'s slot of generation ``gen`` starts in the mapping (diagnostics);
        with the state ``st`` of a collective whose chunks rotate through areas of the slots
        (bcast, gather, scatter, alltoall), where its chunk of that generation starts."""
        header = self.ffi.cast("pc_shm_header_t *", self.base)
        area = 0 if st is None else int(self.lib.pycoll_shm_area(st, gen))
        return int(header.slots_off) + ((gen & 1) * self.size + rank) * self.slot_bytes + area

    def settle(self, timeout_s: float = SETTLE_S) -> Optional[BaseException]:
        """Compare this rank's last gathers that went on without their root (a gather's other
        ranks past a team's first collectives: see ``goes_eagerly`` in ``native/shm.c``) with
        their roots' calls, waiting up to ``timeout_s`` for a root to sign: the
        :class:`MismatchError` to raise if one differs (the segment is broken then), else None.
        A team makes these checks at its later collectives; this makes them when it closes."""
        st = self.new_state(COLL_BARRIER)
        deadline = time.monotonic() + timeout_s
        while True:
            rc = self.lib.pycoll_shm_settle(st, self._polls)
            if rc == 1:
                return None
            if rc < 0:
                return self.native_error(rc)
            if time.monotonic() > deadline or self.lib.pycoll_shm_sleep(st, 10_000_000) < 0:
                return None

    def close(self) -> None:
        """Unmap the segment; a collective posted on it later (an express lane kept by a
        remembered call) finds it broken instead of touching the memory. Raises
        :class:`MismatchError` if one of this rank's last gathers differed from its root's call
        (see :meth:`settle`), once closed."""
        owed = self.settle() if self.broken is None and getattr(self, "base", None) is not None else None
        if self.broken is None:
            self.broken = TransportError("shm: the segment is closed (its team was closed)")
        self.leave(LEFT_CLOSED)
        unwatch(self)
        if getattr(self, "mm", None) is not None:
            self.base = None
            try:
                self.mm.close()
            except BufferError:  # a view is still alive; the mapping goes with the process
                pass
            self.mm = None
        if owed is not None:
            raise owed
