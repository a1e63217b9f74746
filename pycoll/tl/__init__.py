"""Transport layers. Each package is one transport; algorithms only see :class:`Transport`."""

from pycoll.tl.base import Transport, TransportRequest

__all__ = ["Transport", "TransportRequest"]
