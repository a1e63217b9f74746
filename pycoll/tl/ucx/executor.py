"""Lowered programs run by native code over UCX: no Python per step.

:class:`UCXProgramTask` is :class:`pycoll.tl.program_task.NativeProgramTask` over UCX's executor
(``native/exec_ucx.c``): sends and receives are UCP tag messages on the collective's wire tag
(``base | sender << 32 | step``), receives posted into their slice; each ``progress`` (the
engine's poll) lets the C code progress the UCP worker, test what is posted and start what may
start, in the program's order. A failed request, or a peer whose endpoint failed, raises a
TransportError naming the instruction and the peer.

Only untagged collectives (``("c", seq)``, whose wire tags are exact) on an engine without a
credit limit run here: under a credit limit the transport takes early messages into its own stash
(see :mod:`pycoll.tl.ucx.transport`), which the C receives would not see; those programs run in
Python (:class:`pycoll.lower.execute.ProgramTask`).
"""

from __future__ import annotations

from typing import Any

from pycoll.errors import PeerLostError, PycollError, TransportError
from pycoll.tl.program_task import Check, NativeProgram, NativeProgramTask, prepared

__all__ = ["Check", "NativeProgram", "UCXProgramTask", "prepared"]


class UCXProgramTask(NativeProgramTask):
    """One call of a prepared program on ``args`` (a CollArgs on a UCX team)."""

    STATE = "pc_exec_t"

    def _setup(self, e: Any) -> None:
        prepared, t = self.prepared, self.prepared.transport
        n = len(prepared.instrs)
        self._reqs = prepared.ffi.new("void *[]", max(n, 1))
        e.worker, e.eps, e.errflags, e.reduce = t.worker, t.endpoints(), t.error_flags(), prepared.reduce
        e.agree = t.agree_bit
        e.reqs = self._reqs
        self._iovs = prepared.ffi.new("ucp_dt_iov_t[]", 2 * max(n, 1))  # (the parts of marked messages)
        e.iovs = self._iovs

    def _start(self, key: tuple) -> None:
        t = self.prepared.transport
        self.prepared.lib.pc_exec_start(self.e, t.untagged_base(key))
        t.native_started()

    def _run(self, number: int, budget: int, every: int) -> int:
        t = self.prepared.transport
        return self.prepared.lib.pc_exec_run(self.e, t.untagged_base(("c", number)), budget, every)

    def _advance(self) -> int:
        return self.prepared.lib.pc_exec_progress(self.e)

    def _did(self, i: int) -> None:
        self.prepared.lib.pc_exec_did(self.e, i)

    def _started(self) -> None:
        self.prepared.transport.native_started()

    def _stopped(self) -> None:
        self.prepared.transport.native_ended()

    def _give_up(self) -> None:
        """Cancel what is posted; if UCX still holds requests (and so this task's buffers), the
        transport keeps the task until they finish."""
        lib = self.prepared.lib
        lib.pc_exec_abort(self.e)
        self._ended()
        if lib.pc_exec_reap(self.e):
            self.prepared.transport.keep_until_done(self.holding(), lambda: lib.pc_exec_reap(self.e) == 0)

    def _error(self, i: int, what: str) -> PycollError:
        e, t = self.e, self.prepared.transport
        ins = self.prepared.instrs[i]
        if ins.kind in ("send", "recv") and t.error_flags()[ins.peer]:
            return PeerLostError(f"{what} failed: ucx: lost rank {ins.peer}: its endpoint failed "
                                 f"({t.status_text(e.status)})", rank=ins.peer, how=t.status_text(e.status))
        return TransportError(f"{what} failed: {t.status_text(e.status)}")
