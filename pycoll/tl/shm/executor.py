"""Lowered programs run by native code on one host's single-copy point-to-point path.

:class:`ShmProgramTask` is :class:`pycoll.tl.program_task.NativeProgramTask` over the executor of
``native/exec_shm.c``, on the descriptor rings of :mod:`pycoll.tl.shm.transport`: a send posts a
descriptor naming its slice and is done when the peer has read it; a receive reads the payload
straight out of the sender's memory (``process_vm_readv``) into its slice, or into a buffer of its
own when it came before the receive was issued. Messages are matched by the collective's key hash
(:func:`pycoll.tl.base.untagged_hash`) and step, as the transport matches a rank that runs the same
collective in Python. A peer the transport found dead, a descriptor that does not fit, or memory
that cannot be read fails the task with a TransportError naming the instruction and the peer.

Marks: once the planner gave the task its mark, every message but the agreement exchange's
carries it in its descriptor, and a receive whose message carries another mark, none, or another
size fails the task with the mark's MismatchError (:meth:`NativeProgramTask._failure`) once it is
issued, none of that payload read, whether the message came through the ring or, before the
program started, through the transport's stash (:meth:`ShmProgramTask.early`, with its mark).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from pycoll.errors import PeerLostError, PycollError, TransportError
from pycoll.tl.base import AGREE_HASH, untagged_hash
from pycoll.tl.program_task import Check, NativeProgram, NativeProgramTask, prepared

__all__ = ["Check", "NativeProgram", "ShmProgramTask", "prepared"]

_WHY = {2: "its peer was lost", 3: "a message of another size than its slice",
        4: "the shared segment's descriptors are unreadable", 5: "the sender's memory could not be read",
        6: "no memory for a message that came before its receive",
        7: "a message of this collective that the program does not expect",
        8: "an unknown instruction or peer"}  # (PC_SX_*)
_LOST, _CMA, _UNEXPECTED = 2, 5, 7
_RUNNING, _FAILED = 0, -1  # (PC_EXEC_RUNNING, PC_EXEC_FAILED)


class ShmProgramTask(NativeProgramTask):
    """One call of a prepared program on ``args`` (a CollArgs on a team whose point-to-point
    transport is :class:`pycoll.tl.shm.transport.ShmTransport`)."""

    STATE = "pc_sx_t"

    def _setup(self, e: Any) -> None:
        prepared, ffi = self.prepared, self.prepared.ffi
        n = max(len(prepared.instrs), 1)
        self._matched = ffi.new("uint8_t[]", n)
        self._slot = ffi.new("uint32_t[]", n)
        self._early = ffi.new("char *[]", n)
        self._rpeers = ffi.new("int32_t[]", prepared.rpeers or [0])
        prepared.transport.bind_executor(e)
        e.matched, e.slot, e.early = self._matched, self._slot, self._early
        e.rpeers, e.nrpeers = self._rpeers, len(prepared.rpeers)
        e.failed = e.stalled = -1
        self._keys: Tuple[int, int] = (0, 0)
        self._unreadable: Optional[TransportError] = None  # (the error of a sender's memory not read)

    def _begin(self, seq: int) -> None:
        """Start the executor on untagged collective ``seq`` (nothing is told to the transport)."""
        keys = self._keys = (untagged_hash(seq), untagged_hash(seq, True))
        self.prepared.lib.pc_sx_start(self.e, keys[0], keys[1])

    def _start(self, key: tuple) -> None:
        self._begin(key[1])
        self._started()

    def _run(self, number: int, budget: int, every: int) -> int:
        self._begin(number)
        t, keys = self.prepared.transport, self._keys
        if t.has_unexpected_id(keys[0]) or t.has_unexpected_id(keys[1]):  # (the transport took
            t.native_started(self, keys)  # messages of this collective: hand them over first)
            t.native_ended(keys)
        return self.prepared.lib.pc_sx_run(self.e, budget, every)

    def _advance(self) -> int:
        e = self.e
        rc = self.prepared.lib.pc_sx_progress(e)
        if e.stalled >= 0:  # (a sender's memory could not be read: has it left?)
            ins = self.prepared.instrs[e.stalled]
            err = self.prepared.transport.unreadable(ins.peer, ins.slices["buf"][2], e.detail)
            if err is not None:
                self._unreadable = err
                e.failed, e.status = e.stalled, _CMA
                return _FAILED
        return rc

    def _did(self, i: int) -> None:
        self.prepared.lib.pc_sx_did(self.e, i)

    def _started(self) -> None:
        self.prepared.transport.native_started(self, self._keys)

    def _stopped(self) -> None:
        self.prepared.transport.native_ended(self._keys)

    def early(self, src: int, khash: int, step: int, data: np.ndarray, mark: Optional[bytes] = None) -> None:
        """Keep a message of this call that the transport took before the program started (from
        ``src``, key hash ``khash``, ``step``; ``mark``: the mark it carried, None: none) for the
        receive that expects it (a failure, if none does or its mark differs, shows at the next
        progress)."""
        ffi = self.prepared.ffi
        self.prepared.lib.pc_sx_early_marked(self.e, src, int(bool(khash & AGREE_HASH)), step,
                                             ffi.from_buffer(data), data.nbytes,
                                             ffi.NULL if mark is None else mark)

    def _give_up(self) -> None:
        """Let go of the messages read ahead; the transport keeps the task and its buffers while
        peers may still read what its posted sends name."""
        lib = self.prepared.lib
        self._ended()
        if lib.pc_sx_reap(self.e):
            self.prepared.transport.keep_until_done(self.holding(), lambda: lib.pc_sx_reap(self.e) == 0)

    def _error(self, i: int, what: str) -> PycollError:
        e, t = self.e, self.prepared.transport
        ins = self.prepared.instrs[i]
        why = _WHY.get(e.status, f"status {e.status}")
        lost = (t.lost(ins.peer) or t.first_lost) if e.status == _LOST else \
            self._unreadable if e.status == _CMA else None
        if isinstance(lost, PeerLostError):  # (its first cause, as the transport names them)
            return PeerLostError(f"{what} failed: {lost}", rank=lost.rank, pid=lost.pid, how=lost.how)
        if lost is not None:
            return TransportError(f"{what} failed: {lost}")
        if e.status == _UNEXPECTED:
            why += f" (from rank {e.detail})"
        elif e.detail:
            why += f" (error {e.detail})"
        return TransportError(f"{what} failed: shm: {why}")
