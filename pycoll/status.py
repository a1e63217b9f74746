"""What the peers of a collective that timed out are doing, for its :class:`pycoll.TimeoutError`.

On the shared segment a rank reads its peers' signatures directly (``native/shm.c``). Off it, a
rank whose wait times out asks every peer whether it has posted that collective (by its place in
the team's order: untagged collective ``#k``, or use ``k`` of a tag) and what it waits on in
pycoll now: on a communicator of the team's own (:class:`MPIStatus`, teams made from MPI), or
through the team's store (:class:`StoreStatus`, teams made from a store: TCP, UCX, the torch
backend). A peer's engine answers while it waits (a watch, every ``WATCH_S``); a peer that does
not answer within :data:`ASK_S` is not waiting inside pycoll at all (busy in the program, or
blocked outside pycoll), which is worth saying too. The texts read:

    rank 1 has not posted it (it has posted #0-#4 of this team); rank 2 posted it and waits on:
    allreduce:rd@2: recv of 64 B from rank 1; rank 3 did not answer within 0.5 s (not waiting
    inside pycoll: busy in the program, or blocked outside pycoll)

Questions and answers are JSON of fixed fields, checked field by field and size by size when read
(never a pickle: a stranger's bytes in the store must not run as code). Through the store each is
signed with the team's :class:`~pycoll.auth.Seal` and one that fails its MAC is logged and dropped,
never answered or believed; on a communicator MPI is the trusted channel.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional

from pycoll.errors import AuthError
from pycoll.tl.marks import MARK_BYTES

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.auth import Seal
    from pycoll.planner import Planner

#: Seconds a rank whose collective timed out waits for its peers' answers.
ASK_S = 0.5
#: Most tasks a peer reports it waits on.
REPORTED = 3
#: The longest question and answer read (bytes of JSON), the longest text of a task waited on, and
#: how deep a tag's tuples may nest.
QUESTION_BYTES, ANSWER_BYTES, WAIT_TEXT, TAG_DEPTH = 4096, 16384, 1000, 8
_QUERY, _REPLY = 1, 2
#: The tag of the last message a rank sends on a status communicator (see MPIStatus.close), and
#: how long a close waits for the peers' (a peer that left never sends it).
_BYE, BYE_S = 4, 2.0
log = logging.getLogger("pycoll")


def place(key: tuple) -> str:
    """The collective's place in its team's order, as the texts say it."""
    return f"#{key[1]}" if key[0] == "c" else f"use {key[2]} of tag {key[1]!r}"


def report(planner: Planner, key: tuple) -> Dict[str, Any]:
    """This rank's answer for ``planner``'s team: has it posted the collective of ``key``, how many
    of that kind it has posted, what of this team it waits on now, and the mark of that collective
    (hex; "" where it is not in flight here, or unmarked: see :mod:`pycoll.agreement`)."""
    count = planner.posted() if key[0] == "c" else planner.tag_uses(key[1])
    owned = []
    mark = ""
    for task in planner.ctx.in_progress():
        root = task
        while root.parent is not None:
            root = root.parent
        if root.owner is planner or getattr(getattr(root, "task", None), "owner", None) is planner:
            owned.append(task.describe())
        t: Any = task
        while t is not None and not mark:
            channel = getattr(getattr(t, "args", None), "channel", None)
            if channel is not None and channel.mark is not None and channel.key[:len(key)] == key \
                    and channel.mark.owner is planner.marks:
                mark = channel.mark.blob.hex()
            t = t.parent
    return {"posted": count > key[-1], "count": count, "waits_on": owned[:REPORTED], "mark": mark}


def _tag_out(tag: Any, depth: int = 0) -> Any:
    """A user tag as JSON (tuples as lists: a tag is never a list, being hashable)."""
    if depth > TAG_DEPTH:
        raise ValueError("tag nests too deep")
    if tag is None or isinstance(tag, (str, bool, int, float)):
        return tag
    if isinstance(tag, tuple):
        return [_tag_out(t, depth + 1) for t in tag]
    raise ValueError(f"a tag of type {type(tag).__name__} cannot be asked about")


def _tag_in(value: Any, depth: int = 0) -> Any:
    """A tag read back from JSON (lists become tuples again); ValueError for anything else."""
    if depth > TAG_DEPTH:
        raise ValueError("tag nests too deep")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        return tuple(_tag_in(v, depth + 1) for v in value)
    raise ValueError(f"a tag cannot be {type(value).__name__}")


def _count(value: Any) -> int:
    if type(value) is not int or not 0 <= value < 1 << 62:
        raise ValueError(f"not a count: {value!r}")
    return value


def _json(data: bytes, limit: int) -> Any:
    if len(data) > limit:
        raise ValueError(f"{len(data)} B, more than {limit}")
    try:
        return json.loads(bytes(data).decode())
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None


def question_bytes(nonce: int, key: tuple) -> bytes:
    """A question about the collective of ``key`` as JSON; ValueError for a key that cannot be sent."""
    if key[0] == "c":
        fields = ["c", key[1]]
    else:
        fields = ["u", _tag_out(key[1]), key[2]]
    data = json.dumps({"nonce": nonce, "key": fields}).encode()
    if len(data) > QUESTION_BYTES:
        raise ValueError(f"the question takes {len(data)} B (a tag that long?)")
    return data


def read_question(data: bytes) -> tuple:
    """``(nonce, key)`` of a question; ValueError for anything but a well-formed one."""
    q = _json(data, QUESTION_BYTES)
    if not isinstance(q, dict) or set(q) != {"nonce", "key"} or not isinstance(q["key"], list):
        raise ValueError("not a question")
    fields = q["key"]
    if len(fields) == 2 and fields[0] == "c":
        return _count(q["nonce"]), ("c", _count(fields[1]))
    if len(fields) == 3 and fields[0] == "u":
        return _count(q["nonce"]), ("u", _tag_in(fields[1]), _count(fields[2]))
    raise ValueError("not a collective's key")


def answer_bytes(nonce: int, answer: Dict[str, Any]) -> bytes:
    """A rank's answer (see :func:`report`) as JSON."""
    waits = [str(w)[:WAIT_TEXT] for w in answer["waits_on"][:REPORTED]]
    return json.dumps({"nonce": nonce, "posted": bool(answer["posted"]), "count": int(answer["count"]),
                       "waits_on": waits, "mark": str(answer.get("mark", ""))}).encode()


def read_answer(data: bytes) -> tuple:
    """``(nonce, answer)`` of an answer; ValueError for anything but a well-formed one."""
    a = _json(data, ANSWER_BYTES)
    if not isinstance(a, dict) or set(a) != {"nonce", "posted", "count", "waits_on", "mark"}:
        raise ValueError("not an answer")
    waits, mark = a["waits_on"], a["mark"]
    if type(a["posted"]) is not bool or not isinstance(waits, list) or len(waits) > REPORTED \
            or not all(isinstance(w, str) and len(w) <= WAIT_TEXT for w in waits):
        raise ValueError("not an answer")
    if not isinstance(mark, str) or len(mark) not in (0, 2 * MARK_BYTES) or \
            any(c not in "0123456789abcdef" for c in mark):
        raise ValueError("not an answer: a mark is 32 bytes of lowercase hex, or nothing")
    return _count(a["nonce"]), {"posted": a["posted"], "count": _count(a["count"]), "waits_on": waits,
                                "mark": bytes.fromhex(mark)}


def _ranks(ranks: List[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}"


def explain(key: tuple, answers: Dict[int, Optional[Dict[str, Any]]]) -> str:
    """The peers' answers about the collective of ``key`` as one text (empty if there is none)."""
    parts = []
    behind = sorted((a["count"], r) for r, a in answers.items() if a is not None and not a["posted"])
    for count, group in itertools.groupby(behind, key=lambda x: x[0]):
        ranks = [r for _, r in group]
        if key[0] == "c":
            posted = f"#0-#{count - 1}" if count > 1 else "#0" if count else "nothing"
        else:
            posted = f"{count} use{'s' if count != 1 else ''} of the tag"
        waits = answers[ranks[0]]["waits_on"]
        who = f"; rank {ranks[0]} waits on: " if len(ranks) > 1 else "; waits on: "
        parts.append(f"{_ranks(ranks)} {'have' if len(ranks) > 1 else 'has'} not posted it (posted {posted} "
                     f"of this team{who + '; '.join(waits) if waits else ''})")
    for r, a in sorted(answers.items()):
        if a is not None and a["posted"] and a["waits_on"]:
            parts.append(f"rank {r} posted it and waits on: {'; '.join(a['waits_on'])}")
    silent = sorted(r for r, a in answers.items() if a is None)
    if silent:
        parts.append(f"{_ranks(silent)} did not answer within {ASK_S:g} s (not waiting inside pycoll: "
                     "busy in the program, or blocked outside pycoll)")
    return "; ".join(parts)


class MPIStatus:
    """Questions and answers about the team's collectives on ``comm`` (a communicator of the
    team's own, so that no collective's message matches them), as bytes of JSON. ``lock``: the
    engine's (its watch and a timed-out wait may run in two threads)."""

    def __init__(self, comm: Any, planner: Planner, lock: Any) -> None:
        self.comm, self.planner, self.lock = comm, planner, lock
        self._sent: List[Any] = []  # (request, bytes) of answers and questions not yet known sent
        #: The engine's watch that calls :meth:`answer` (set by the bootstrap).
        self.watch: Any = None

    def answer(self, stale: bool = True) -> bool:
        """Answer every question that has arrived (the engine's watch while it waits); ``stale``:
        also drop answers that came after their question gave up waiting."""
        from mpi4py import MPI  # noqa: PLC0415 - only where MPI is in use

        comm, status = self.comm, MPI.Status()
        with self.lock:
            self._sent = [(req, data) for req, data in self._sent if not req.Test()]
            while True:
                msg = comm.improbe(tag=_QUERY, status=status)
                if msg is None:
                    break
                try:
                    nonce, key = read_question(_received(msg, status, MPI))
                except ValueError as exc:
                    log.warning("pycoll: dropped a malformed status question from rank %d: %s",
                                status.Get_source(), exc)
                    continue
                data = answer_bytes(nonce, report(self.planner, key))
                self._sent.append((comm.Isend([data, MPI.BYTE], status.Get_source(), _REPLY), data))
            while stale:
                msg = comm.improbe(tag=_REPLY, status=status)
                if msg is None:
                    break
                _received(msg, status, MPI)
        return True

    def ask(self, key: tuple, timeout_s: float = ASK_S) -> Dict[int, Optional[Dict[str, Any]]]:
        """Every peer's answer about the collective of ``key`` (None: no answer in time)."""
        from mpi4py import MPI  # noqa: PLC0415

        comm, me = self.comm, self.comm.Get_rank()
        nonce = secrets.randbits(62)
        peers = [r for r in range(comm.Get_size()) if r != me]
        answers: Dict[int, Optional[Dict[str, Any]]] = dict.fromkeys(peers)
        try:
            data = question_bytes(nonce, key)
        except ValueError:
            return {}  # (a tag JSON cannot carry: nothing to ask)
        with self.lock:
            self._sent += [(comm.Isend([data, MPI.BYTE], p, _QUERY), data) for p in peers]
        deadline = time.monotonic() + timeout_s
        status = MPI.Status()
        while any(a is None for a in answers.values()) and time.monotonic() < deadline:
            self.answer(stale=False)  # (two ranks that time out on each other answer each other)
            with self.lock:
                msg = comm.improbe(tag=_REPLY, status=status)
                got = _received(msg, status, MPI) if msg is not None else None
            if got is None:
                time.sleep(0.0005)
                continue
            try:
                said, answer = read_answer(got)
            except ValueError as exc:
                log.warning("pycoll: dropped a malformed status answer from rank %d: %s",
                            status.Get_source(), exc)
                continue
            if said == nonce:  # (else an answer to an earlier question that came late)
                answers[status.Get_source()] = answer
        return answers

    def close(self) -> bool:
        """The team closes (collective): let its communicator go, with nothing left in it. Every
        rank sends each peer a last message and takes every message from it up to that one
        (questions, answers, the news of :mod:`pycoll.news`: dropped), for up to :data:`BYE_S`.
        MPI reuses a freed communicator's context: a message left in it would reach a later
        team's communicator of the same context (its news, or a stray its marks mistake for a
        peer's other call). So the communicator is freed only once every peer's last message came;
        returns whether it was (a peer that left, or closed more than BYE_S later, leaves it
        allocated: MPICH has about 2,000)."""
        from mpi4py import MPI  # noqa: PLC0415 - only where MPI is in use

        waiting = {-1}
        with self.lock:
            linger(req for req, _ in self._sent)  # (peers take them below: never MPI_Cancel a send)
            self._sent = []
            try:
                comm = self.comm
                me = comm.Get_rank()
                waiting = {r for r in range(comm.Get_size()) if r != me}
                byes = [comm.Isend([b"", MPI.BYTE], r, _BYE) for r in waiting]
                deadline, status = time.monotonic() + BYE_S, MPI.Status()
                while waiting and time.monotonic() < deadline:
                    msg = comm.improbe(status=status)
                    if msg is None:
                        time.sleep(0.0002)
                        continue
                    _received(msg, status, MPI)
                    if status.Get_tag() == _BYE:
                        waiting.discard(status.Get_source())
                linger(byes)
                if not waiting:
                    comm.Free()
            except Exception:  # noqa: BLE001 - MPI finalized already: nothing to free
                pass
        return not waiting


#: Sends not known finished when their communicator went: kept (with their buffers) until they are.
_LINGERING: List[Any] = []


def linger(requests: Iterable[Any]) -> None:
    """Keep MPI send ``requests`` (and so their buffers) alive until they finish, without waiting:
    a send is never cancelled (``MPI_Cancel`` of a send is deprecated, and crashed MPICH here)."""
    _LINGERING[:] = [r for r in _LINGERING if not r.Test()]
    _LINGERING.extend(r for r in requests if not r.Test())


def free_drained(comm: Any) -> None:
    """Free a closing team's own communicator ``comm`` (its duplicate of the user's) after taking
    every message left in it (a failed collective's peer sends that no receive took): MPI reuses a
    freed communicator's context, and a later team would receive them. Called once every peer's
    goodbye came on the status communicator (each peer sent its last data before it). Never
    freeing them ran MPICH out of communicators after about 2,000 teams."""
    from mpi4py import MPI  # noqa: PLC0415 - only where MPI is in use

    try:
        status = MPI.Status()
        msg = comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status=status)
        while msg is not None:
            _received(msg, status, MPI)
            msg = comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status=status)
        comm.Free()
    except Exception:  # noqa: BLE001 - MPI finalized already: nothing to free
        pass


def _received(msg: Any, status: Any, mpi: Any) -> bytes:
    """The bytes of the probed message ``msg`` (``status`` its probe's)."""
    data = bytearray(status.Get_count(mpi.BYTE))
    msg.Recv([data, mpi.BYTE])
    return bytes(data)


def _forget(store: Any, key: str) -> None:
    """Delete ``key`` where the store can (pycoll's and c10d's stores can)."""
    delete = getattr(store, "delete_key", None)
    if delete is not None:
        try:
            delete(key)
        except Exception:  # noqa: BLE001 - a store that cannot delete keeps it
            pass


class StoreStatus:
    """Questions and answers about the team's collectives through its store: rank p's questions
    are the keys ``PREFIX/q/p/1``, ``/2``, ... (numbered by ``add`` on ``PREFIX/q/p``), each
    answered at ``PREFIX/a/NONCE/p``; each key is deleted once read (an answer that comes after its
    question gave up stays). Every entry is signed by ``seal`` under its key's name; one that
    fails its MAC or is malformed is logged and dropped (a question so dropped is not answered)."""

    def __init__(self, store: Any, prefix: str, rank: int, size: int, planner: Planner, seal: Seal) -> None:
        self.store, self.prefix, self.rank, self.size, self.planner = store, prefix, rank, size, planner
        self.seal = seal
        self._answered = 0  # questions to this rank answered

    def answer(self, store: Any) -> None:
        """Answer every question that has arrived, on ``store`` (the connection of the engine's
        watch: :meth:`pycoll.recovery.Recovery.look`)."""
        from pycoll.store import store_get  # noqa: PLC0415 - pycoll.store imports nothing of this

        while store.check([f"{self.prefix}/q/{self.rank}/{self._answered + 1}"]):
            self._answered += 1
            where = f"{self.prefix}/q/{self.rank}/{self._answered}"
            blob = store_get(store, where)
            _forget(store, where)
            try:
                _, content = self.seal.verify(where, blob, self.size)
                nonce, key = read_question(content)
            except AuthError:
                continue  # (logged)
            except ValueError as exc:
                log.warning("pycoll: dropped a malformed status question %s: %s", where, exc)
                continue
            there = f"{self.prefix}/a/{nonce}/{self.rank}"
            store.set(there, self.seal.sign(there, self.rank, answer_bytes(nonce, report(self.planner, key))))

    def ask(self, key: tuple, timeout_s: float = ASK_S) -> Dict[int, Optional[Dict[str, Any]]]:
        """Every peer's answer about the collective of ``key`` (None: no answer in time)."""
        from pycoll.store import store_get  # noqa: PLC0415

        store, nonce = self.store, secrets.randbits(62)
        peers = [r for r in range(self.size) if r != self.rank]
        try:
            question = question_bytes(nonce, key)
        except ValueError:
            return {}  # (a tag JSON cannot carry: nothing to ask)
        for p in peers:
            number = store.add(f"{self.prefix}/q/{p}", 1)
            where = f"{self.prefix}/q/{p}/{number}"
            store.set(where, self.seal.sign(where, self.rank, question))
        answers: Dict[int, Optional[Dict[str, Any]]] = dict.fromkeys(peers)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.answer(store)  # (two ranks that time out on each other answer each other)
            for p in [p for p, a in answers.items() if a is None]:
                where = f"{self.prefix}/a/{nonce}/{p}"
                if store.check([where]):
                    blob = store_get(store, where)
                    _forget(store, where)
                    try:
                        said, answer = read_answer(self.seal.verify(where, blob, self.size, rank=p)[1])
                    except AuthError:
                        continue  # (logged)
                    except ValueError as exc:
                        log.warning("pycoll: dropped a malformed status answer %s: %s", where, exc)
                        continue
                    if said == nonce:
                        answers[p] = answer
            if all(a is not None for a in answers.values()):
                break
            time.sleep(0.005)
        return answers

    def close(self) -> None:
        """The team closes (nothing of its own to release)."""
