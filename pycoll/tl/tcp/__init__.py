"""The TCP transport: a socket per peer, for teams bootstrapped from a store without MPI."""

from pycoll.tl.tcp.transport import TCPTransport, connect_mesh

__all__ = ["TCPTransport", "connect_mesh"]
