"""An uncaught exception on a rank of an MPI job ends the whole job, as ``python -m mpi4py`` does.

Without it, a rank whose script raises stays alive inside ``MPI_Finalize`` (mpi4py finalizes MPI
at interpreter exit), and peers waiting for it over MPI's point to point wait for the whole
timeout (on one host's shared segment they learn in about 50 ms: it says it left). With it
(``PYCOLL_ABORT_ON_ERROR=1``, the default), after the traceback is printed, mpi4py calls
``MPI_Abort`` instead of ``MPI_Finalize`` at exit and the launcher ends every rank, with the
error's exit status. ``PYCOLL_ABORT_ON_ERROR=0`` leaves it to the program. Installed when the
first team is made from an MPI communicator; an interactive interpreter (which goes on after an
exception) is left alone.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pycoll import config

_installed = 0  # the process that installed the hook (0: none; a forked child installs its own)


def install() -> None:
    """Abort the MPI job at exit after an uncaught exception (once per process; see above)."""
    global _installed
    if _installed == os.getpid() or not config.get("PYCOLL_ABORT_ON_ERROR"):
        return
    _installed = os.getpid()
    previous = sys.excepthook

    def hook(kind: type, value: BaseException, tb: Any) -> None:
        try:
            previous(kind, value, tb)  # (the traceback first, and pycoll's leave markers)
        finally:
            if not (hasattr(sys, "ps1") or sys.flags.interactive):
                from mpi4py.run import set_abort_status  # noqa: PLC0415 - MPI is up: a team was made

                set_abort_status(value)

    sys.excepthook = hook
