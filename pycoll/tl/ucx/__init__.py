"""UCX transport (UCP tag API through a cffi binding built at install; see transport.py)."""

from __future__ import annotations

import re
from typing import Any, Dict

from pycoll.tl.ucx import loader
from pycoll.tl.ucx.transport import UCXTransport, context_worker, info_text

__all__ = ["UCXTransport", "context_worker", "info"]


def info() -> Dict[str, Any]:
    """UCX as this process would use it: ``version``, ``library`` (the libucp file and where it
    came from: ``process`` when MPICH's copy was already loaded, ``wheel``, or PYCOLL_UCX_LIB),
    ``transports`` (the ``transport/device`` resources a UCP context found) and ``text`` (UCX's own
    description). Raises :class:`~pycoll.errors.TransportError` when UCX cannot be loaded."""
    text = info_text()
    transports = []
    for m in re.finditer(r"resource\s+\d+\s*:\s*md\s+\d+\s+dev\s+\d+\s+flags\s+\S+\s+(\S+)", text):
        if m.group(1) not in transports:
            transports.append(m.group(1))
    return {"version": ".".join(map(str, loader.version())), "library": loader.library_path(),
            "source": loader.source, "transports": transports, "text": text}
