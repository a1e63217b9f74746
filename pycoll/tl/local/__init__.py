"""The in-process transport: n ranks in one process exchanging messages through memory."""

from pycoll.tl.local.transport import LocalFabric, LocalTransport

__all__ = ["LocalFabric", "LocalTransport"]
