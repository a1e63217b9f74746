"""The settings pycoll gives the communication libraries that run inside its processes (the UCX that
MPICH's wheel loads for MPI, and pycoll's own UCX), set as environment variables before they
start and only where the user has not set them: importing pycoll sets them for this process (and
so for an MPI that starts after it, and for the ranks ``pycoll run`` starts, which inherit them).

``UCX_RCACHE_ENABLE=n``: UCX's registration cache hears of every region the process unmaps (every
large array numpy frees) and queues it, 144 B each, until the next memory registration through
that cache empties the queue. In a job whose collectives run on pycoll's transports, MPI's UCX
does no registration (and on one host MPICH moves its own messages through its shared memory), so
the queue grew for as long as the program ran: 13.9 MiB per 100,000 freed arrays, 10 MiB over
10,000 random collectives. Without the cache UCX's memory domains keep their own (an RDMA NIC's
registrations are still cached); on one host pycoll's and MPI's timings are unchanged.
"""

from __future__ import annotations

import os
from typing import Dict, MutableMapping

#: The variables and the values pycoll gives them where they are unset.
DEFAULTS: Dict[str, str] = {"UCX_RCACHE_ENABLE": "n"}


def apply(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set each of :data:`DEFAULTS` in ``environ`` that is not set there already."""
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
