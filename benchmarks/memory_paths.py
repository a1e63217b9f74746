"""What each way of moving memory between ranks costs on this node, every rank at once: the
paths pycoll's large-message collectives take, measured side by side.

- ``private``: a copy between two private buffers (numpy's, transparent huge pages where the
  kernel gives them): the copy bound of ``copy_bound.py``;
- ``memfd``: the same copy inside a shared memfd mapping (what ``team.alloc`` and the segment
  use), with 4 KiB pages, and again after ``madvise(MADV_HUGEPAGE)`` where the kernel allows
  huge pages for shared memory (``/sys/kernel/mm/transparent_hugepage/shmem_enabled``);
- ``cma read``: ``process_vm_readv`` of the next rank's private buffer, into a private buffer
  (one call per block of 64 KiB, 1 MiB, or the whole), and into a 64 KiB buffer kept in cache
  (the remote read alone).

GB/s per rank counts the bytes read and written (2 per byte copied). Prints the kernel's huge-page
settings first, since they decide the memfd rows.

    mpiexec -n 16 python benchmarks/memory_paths.py [--bytes 64M]
"""

from __future__ import annotations

import argparse
import mmap
import os
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

from pycoll.config import parse_bytes
from pycoll.native import address, ffi, lib


def timed(comm: MPI.Comm, call: Callable[[], None], reps: int = 3) -> float:
    """The slowest rank's time of the best of ``reps`` rounds, every rank calling at once."""
    call()
    best = float("inf")
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        call()
        best = min(best, comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return best


def shared_pair(nbytes: int, huge: bool) -> tuple:
    fd = os.memfd_create("pycoll-probe", os.MFD_CLOEXEC)
    os.ftruncate(fd, 2 * nbytes)
    mm = mmap.mmap(fd, 2 * nbytes)
    os.close(fd)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    arr = np.frombuffer(mm, np.uint8)
    arr[:] = 1
    return mm, arr[:nbytes], arr[nbytes:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", default="64M", help="each rank's buffer")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n, rank = comm.size, comm.rank
    nb = parse_bytes(args.bytes)
    if rank == 0:
        for f in ("enabled", "shmem_enabled", "defrag"):
            try:
                with open(f"/sys/kernel/mm/transparent_hugepage/{f}") as fh:
                    print(f"# thp {f}: {fh.read().strip()}")
            except OSError as exc:
                print(f"# thp {f}: {exc}")
        print(f"# {n} ranks, {nb} B per rank; GB/s per rank (read + write)")
    rows = []
    src, dst = np.ones(nb, np.uint8), np.zeros(nb, np.uint8)
    rows.append(("private copy", 2 * nb / timed(comm, lambda: np.copyto(dst, src))))
    for huge in (False, True):
        mm, a, b = shared_pair(nb, huge)
        rows.append((f"memfd copy{' (MADV_HUGEPAGE)' if huge else ''}",
                     2 * nb / timed(comm, lambda a=a, b=b: np.copyto(b, a))))
        del a, b
        mm.close()
    peer = (rank + 1) % n
    pids = comm.allgather(os.getpid())
    addrs = comm.allgather(address(src))
    small = np.zeros(64 << 10, np.uint8)

    def cma(block: int, into_cache: bool) -> None:
        for at in range(0, nb, block):
            m = min(block, nb - at)
            to = ffi.from_buffer(small) if into_cache else ffi.cast("char *", ffi.from_buffer(dst)) + at
            got = lib.pycoll_cma_read(pids[peer], to, addrs[peer] + at, m)
            if got != m:
                raise OSError(f"process_vm_readv: {got}")

    for block in (64 << 10, 1 << 20, nb):
        seconds = timed(comm, lambda b=block: cma(b, False))
        rows.append((f"cma read, {block >> 10} KiB calls", 2 * nb / seconds))
    rows.append(("cma read, 64 KiB calls into cache", 2 * nb / timed(comm, lambda: cma(64 << 10, True))))
    comm.Barrier()
    if rank == 0:
        for name, bw in rows:
            print(f"{name:<40} {bw / 1e9:8.2f} GB/s")


if __name__ == "__main__":
    main()
