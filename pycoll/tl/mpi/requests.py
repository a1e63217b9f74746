"""The requests of :mod:`pycoll.tl.mpi.transport`: MPI's requests behind a transport request
(plain, a checked key's header then payload, a marked message packed or in two parts, a marked
send and receive with one peer), how they are tested, and those given up but kept until MPI is
done with them."""

from __future__ import annotations

from typing import Any, List, Optional

from mpi4py import MPI

from pycoll.errors import TransportError
from pycoll.tl.base import Transport, TransportRequest
from pycoll.tl.marks import MARK_BYTES


def failure(req: TransportRequest, exc: Any, statuses: Any = (),
            transport: Optional[Transport] = None) -> TransportError:
    """The TransportError of ``req`` whose MPI requests failed with ``exc`` (their ``statuses``,
    when tested together, hold each one's error). A message longer than the receive
    (``MPI_ERR_TRUNCATE``) says what that means here: the ranks' calls differ in size. A peer gone
    (its team knows, or MPICH could not read its memory: errno 3) gives ``transport.lost_error``."""
    codes = [exc.Get_error_code(), *(st.Get_error() for st in statuses)]
    what = f"{req.kind} {'to' if req.kind == 'send' else 'from'} rank {req.peer} (tag {req.tag!r})"
    why = str(exc)
    if any(code and MPI.Get_error_class(code) == MPI.ERR_TRUNCATE for code in codes):
        why = ("a message larger than this rank's receive buffer arrived (MPI_ERR_TRUNCATE): the ranks' "
               "calls differ in size (PYCOLL_CHECK=on, the default, checks every call and names the ranks "
               "that differ)")
    elif transport is not None:  # (a peer gone: PeerLostError; MPICH's stack's last line only)
        last = why.strip().splitlines()[-1]
        return transport.lost_error(req.peer, f"the {what} failed: {last}", "(errno 3)" in why) or \
            TransportError(f"mpi: {what} failed: {why}")
    return TransportError(f"mpi: {what} failed: {why}")


def test_mpi(req: TransportRequest, mpi_reqs: Any, transport: Optional[Transport] = None) -> bool:
    """Test MPI requests for ``req``: done when all are; an MPI error becomes :func:`failure`'s."""
    try:
        ok = mpi_reqs[0].Test() if len(mpi_reqs) == 1 else MPI.Request.Testall(mpi_reqs)
    except MPI.Exception as exc:
        req.error = failure(req, exc, transport=transport)
        raise req.error from None
    if ok:
        req.done = True
    return ok


#: Requests given up before they finished (a collective that failed or was cancelled): kept, with
#: their buffers, until MPI is done with them (see MPIRequest.cancel; every MPI transport's
#: progress looks at them).
HELD: List[Any] = []
#: Where a request's first receive is among its MPI requests, by kind (sends come first).
FIRST_RECV = {"send": 1 << 30, "recv": 0, "exchange": 1}


class MPIRequest(TransportRequest):
    __slots__ = ("reqs", "keep")

    def test(self) -> bool:
        if self.error is not None:  # (first: a receive may be done with an error, see unmarked)
            raise self.error
        if self.done:
            return True
        return test_mpi(self, self.reqs)

    def cancel(self) -> None:
        """Withdraw its receives (``MPI_Cancel``; a send is never cancelled: deprecated, and it
        crashed MPICH) and keep it, and through it its buffers (``keep``, and what mpi4py's
        requests hold), until MPI is done with them: MPI may still write into a receive's buffer
        or read a send's after its collective let go of them."""
        if self.done:
            return
        for req in self.reqs[FIRST_RECV.get(self.kind, 0):]:
            try:
                req.Cancel()
            except MPI.Exception:
                pass
        HELD.append(self)


def let_go() -> int:
    """Drop the given-up requests MPI is done with (see MPIRequest.cancel); how many."""
    held = []
    for req in HELD:
        try:
            if not MPI.Request.Testall(req.reqs):
                held.append(req)
        except MPI.Exception:  # done, with an error (a truncated or cancelled message): let go
            continue
    gone = len(HELD) - len(held)
    HELD[:] = held
    return gone


class MPIRecv(MPIRequest):
    """A receive posted to MPI (or a send and a receive: ``exchange``); counted when it is done."""

    __slots__ = ("transport",)

    def test(self) -> bool:
        if self.error is not None:  # (first: a receive may be done with an error, see unmarked)
            raise self.error
        if self.done:
            return True
        return self.transport.test_recv(self, self.reqs)


class CheckedRecv(TransportRequest):
    """A receive of a checked key: waits for its header, then for its payload (``mark``: the one
    its header must carry, or None)."""

    __slots__ = ("buf", "transport", "khash", "step", "wire", "payload", "mark")

    def test(self) -> bool:
        if self.error is not None:  # (first: a receive may be done with an error, see unmarked)
            raise self.error
        if self.done:
            return True
        if self.payload is None:
            self.transport.probe_channel(self.peer, self.wire)
            if self.payload is None or self.done:
                if self.error is not None:
                    raise self.error
                return self.done
        if test_mpi(self, (self.payload,), self.transport):  # its payload (nbytes: its header's) arrived
            self.transport.traffic.received(self.peer, self.nbytes)
            return True
        return False

    def cancel(self) -> None:
        if not self.done:
            self.transport.withdraw(self)
            if self.payload is not None:  # (its payload's receive is posted: withdraw it too)
                held = MPIRequest("recv", self.peer, self.tag, self.nbytes)
                held.reqs, held.keep = (self.payload,), self.buf
                held.cancel()


class Stage:
    """Where a packed marked message of ``n`` payload bytes lands: ``buf``, the mark then the
    payload (``tail``, a view of it). A receive takes one from its channel's free stages and gives
    it back once it handed the payload over; one that failed or was given up keeps it (MPI may
    still write there). It keeps no view of the buffers it copies to: that would pin a caller's
    bytearray or mmap (no resize, no close) after the call."""

    __slots__ = ("n", "buf", "tail")

    def __init__(self, n: int) -> None:
        self.n = n
        self.buf = bytearray(MARK_BYTES + n)
        self.tail = memoryview(self.buf)[MARK_BYTES:]


class PackedRecv(MPIRequest):
    """A marked untagged receive of at most ``PACK_BYTES``: the message (mark, then payload)
    lands in ``stage`` (a :class:`Stage` taken from ``home``, its channel's free ones, at
    ``slot``); once its mark matches, the payload is copied to ``buf`` and the stage is free
    again. A mark or size that differs raises the error ``mark.judge`` makes (a message too long:
    MPI fills the receive as far as it goes, its mark included; ``nbytes`` -1). ``reqs`` is its
    receive, or (see :class:`PackedExchange`) a send and then its receive."""

    __slots__ = ("transport", "stage", "buf", "mark", "got", "home", "slot")

    def test(self) -> bool:
        # The hot path of every small marked call over MPI: written out, one Python call when
        # everything is there (one Testall of send and receive).
        if self.error is not None:  # (first: a receive may be done with an error, see unmarked)
            raise self.error
        if self.done:
            return True
        reqs = self.reqs
        if self.got:  # (its receive landed before its send was done)
            return self._sent()
        transport = self.transport
        statuses = transport.statuses
        last = len(reqs) - 1
        both = True
        try:
            if not (reqs[0].Test(statuses[0]) if last == 0 else MPI.Request.Testall(reqs, statuses)):
                # (a send not done: the receive alone, so that a mark that differs raises now)
                if last == 0 or not reqs[1].Test(statuses[1]):
                    return False
                both = False
            got = statuses[last].Get_count(MPI.BYTE)
        except MPI.Exception as exc:
            got = self._truncated(exc, statuses[:last + 1])
        stage, buf = self.stage, self.buf
        n = got - MARK_BYTES if got >= MARK_BYTES else (0 if got >= 0 else -1)  # (shorter: no mark)
        self.nbytes = n
        if n != buf.nbytes or not stage.buf.startswith(self.mark.blob):
            self._judge(got, n)
        transport.traffic.received(self.peer, n)
        if n:
            buf.data[:] = stage.tail  # (ndarray.data: cheaper than memoryview(buf), which parses arguments)
        self.home[self.slot] = stage  # (free again)
        if both:
            self.done = True
            return True
        self.got = True
        return self._sent()

    def _sent(self) -> bool:
        """Whether its send (``reqs[0]``) is done, its receive having landed."""
        return test_mpi(self, self.reqs[:1], self.transport)

    def _truncated(self, exc: Any, statuses: Any) -> int:
        """-1 when ``exc`` (of testing its requests, with their ``statuses``) is a message longer
        than the receive; else raise :func:`failure`'s error."""
        classes = (exc.Get_error_class(), *(MPI.Get_error_class(st.Get_error()) for st in statuses))
        if MPI.ERR_TRUNCATE not in classes:
            self.error = failure(self, exc, statuses, self.transport)
            raise self.error from None
        return -1

    def _judge(self, got: int, n: int) -> None:
        """Fail the receive: the message of ``got`` bytes (-1: more than fit) carried another mark,
        or a payload of ``n`` bytes where the buffer holds another size."""
        data = self.stage.buf
        self.transport.traffic.received(self.peer, n if n > 0 else 0)
        theirs = bytes(data[:MARK_BYTES] if got < 0 else data[:min(got, MARK_BYTES)])
        self.error = self.mark.judge(self.peer, theirs, n, self.buf.nbytes)
        raise self.error


class PackedExchange(PackedRecv):
    """A marked untagged send and receive of at most ``PACK_BYTES`` each with one peer
    (``exchange``): ``reqs`` is (send, receive), tested together; the receive lands as
    :class:`PackedRecv`'s, and is tested alone while the send is not done (one whose mark differs
    raises, its send done or not; ``got`` once it landed). One request instead of three."""

    __slots__ = ()


class SplitRecv(MPIRequest):
    """A marked untagged receive of more than ``PACK_BYTES``: the mark lands in ``area`` (the
    channel's, for that peer and step; or the stash's copy, ``reqs[0]`` None), then the payload in
    ``buf`` (``reqs[1]``, on the tag with the transport's ``_PART`` set). The mark is compared as
    soon as it is there: a peer with another call fails the receive before its payload comes
    (which is then withdrawn: it may never come)."""

    __slots__ = ("transport", "area", "buf", "mark", "status")

    def test(self) -> bool:
        if self.error is not None:  # (first: a receive may be done with an error, see unmarked)
            raise self.error
        if self.done:
            return True
        first, payload = self.reqs
        if first is not None:
            n = self._arrived(first)
            if n is None:
                return False
            self.reqs = (None, payload)
            if n != MARK_BYTES or self.area.tobytes() != self.mark.blob:  # (a packed message: another size)
                return self._judge(n - MARK_BYTES if n >= MARK_BYTES else 0)
        n = self._arrived(payload)
        if n is None:
            return False
        if n < 0:
            return self._judge(-1)
        self.nbytes = n
        self.transport.traffic.received(self.peer, n)
        if n != self.buf.nbytes:  # (the same mark, another size: v-counts that differ)
            return self._judge(n)
        self.done = True
        return True

    def _arrived(self, req: Any) -> Optional[int]:
        """The bytes of MPI receive ``req`` once it is done (-1: a longer message); None: not yet."""
        status = self.status
        try:
            if not req.Test(status):
                return None
        except MPI.Exception as exc:
            if exc.Get_error_class() == MPI.ERR_TRUNCATE:
                return -1
            self.error = failure(self, exc, transport=self.transport)
            self._withdraw()
            raise self.error from None
        return status.Get_count(MPI.BYTE)

    def _judge(self, n: int) -> bool:
        """Fail the receive: its peer's mark (in ``area``: MPI fills a truncated receive as far as
        it goes) or size differs from this call's; the payload part is withdrawn."""
        theirs = self.area.tobytes()
        self._withdraw()
        self.done = True
        self.error = self.error or self.mark.judge(self.peer, theirs, n, self.buf.nbytes)
        raise self.error

    def _withdraw(self) -> None:
        payload = self.reqs[1]
        if payload is not None and not payload.Test():
            held = MPIRequest("recv", self.peer, self.tag, self.nbytes)
            held.reqs, held.keep = (payload,), self.buf
            held.cancel()
        self.reqs = (None, None)

    def cancel(self) -> None:
        if not self.done:
            first, payload = self.reqs
            held = MPIRequest("recv", self.peer, self.tag, self.nbytes)
            held.reqs = tuple(r for r in (first, payload) if r is not None)
            held.keep = (self.buf, self.area)
            held.cancel()
