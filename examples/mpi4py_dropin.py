"""A plain mpi4py program moved onto pycoll by changing two lines (marked ``# pycoll``).

Everything else is the mpi4py code it was: buffer collectives with MPI's argument order, an
``MPI.IN_PLACE``, a non-blocking ``Iallreduce`` overlapped with work, a ``Split``. Each result is
checked against numpy; rank 0 prints one line.

    mpiexec -n 2 python examples/mpi4py_dropin.py      # any number of ranks

Drop ``import pycoll.mpi`` and write ``comm = MPI.COMM_WORLD`` again, and it runs on mpi4py alone
with the same results.
"""

import numpy as np
from mpi4py import MPI

import pycoll.mpi  # pycoll: the first changed line

comm = pycoll.mpi.Comm(MPI.COMM_WORLD)  # pycoll: the second changed line (was: comm = MPI.COMM_WORLD)
rank, size = comm.Get_rank(), comm.Get_size()
everyone = np.arange(size)

# Allreduce: the sum of every rank's vector, then the maximum in place.
x = np.arange(8, dtype=np.float64) * (rank + 1)
total = np.empty_like(x)
comm.Allreduce(x, total, op=MPI.SUM)
assert np.allclose(total, np.arange(8) * sum(everyone + 1))
comm.Allreduce(MPI.IN_PLACE, x, op=MPI.MAX)
assert np.allclose(x, np.arange(8) * size)

# Bcast from rank 0 (a [buffer, datatype] specification works as in mpi4py).
params = np.arange(5, dtype=np.int32) if rank == 0 else np.zeros(5, dtype=np.int32)
comm.Bcast([params, MPI.INT], root=0)
assert np.array_equal(params, np.arange(5))

# Allgather: one block of 3 from every rank, in rank order.
mine = np.full(3, rank, dtype=np.int64)
blocks = np.empty(3 * size, dtype=np.int64)
comm.Allgather(mine, blocks)
assert np.array_equal(blocks, np.repeat(everyone, 3))

# Scatter: the root hands rank r the r-th block of 4.
whole = np.arange(4 * size, dtype=np.float32) if rank == 0 else None
part = np.empty(4, dtype=np.float32)
comm.Scatter(whole, part, root=0)
assert np.array_equal(part, np.arange(4 * rank, 4 * rank + 4))

# Iallreduce: start it, compute something else meanwhile, then Wait.
grad = np.full(1000, float(rank))
reduced = np.empty_like(grad)
req = comm.Iallreduce(grad, reduced, op=MPI.SUM)
local = np.sin(np.linspace(0, 1, 10_000)).sum()  # work that overlaps the collective
req.Wait()
assert np.allclose(reduced, sum(everyone)) and local > 0

# Split: even and odd ranks, each half sums its ranks.
half = comm.Split(color=rank % 2, key=rank)
assert type(half) is type(comm)  # (a communicator made from a pycoll one is a pycoll one too)
mine_sum = np.array([rank], dtype=np.int64)
half_sum = np.empty(1, dtype=np.int64)
half.Allreduce(mine_sum, half_sum, op=MPI.SUM)
assert half_sum[0] == sum(everyone[everyone % 2 == rank % 2]), half_sum
half.Free()

if rank == 0:
    print(f"mpi4py drop-in: Allreduce, Bcast, Allgather, Scatter, Iallreduce and Split on {size} ranks "
          f"match numpy (comm is {type(comm).__module__}.{type(comm).__name__})", flush=True)
