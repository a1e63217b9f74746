"""The MPI transport: mpi4py Isend/Irecv on buffers (never pickle) over a team's communicator."""

from pycoll.tl.mpi.transport import MPITransport

__all__ = ["MPITransport"]
