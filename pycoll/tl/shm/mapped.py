"""Memory every rank of a host's team maps: arrays made by ``team.alloc`` that the ranks read and
write directly (the ``mapped`` allreduce reduces straight out of its peers' inputs and writes
straight into their outputs, one copy's worth of memory traffic).

A region is one shared mapping of ``nranks`` parts, rank r's part at ``base + r * part_bytes`` in
every process; rank r's array is its own part. Rank 0 makes it (an anonymous memfd), the others
open it through ``/proc/<pid>/fd`` as the segment does; it lives as long as an array (or any view
of it) does in some process, and no file remains anywhere.
"""

from __future__ import annotations

import math
import mmap
import os
import weakref
from typing import Callable, List, Optional, Sequence, Union

import numpy as np

from pycoll.errors import MismatchError, TransportError

#: Each rank's part starts on a page of its own (and so on a cache line of its own).
PAGE = mmap.PAGESIZE


class Region:
    """One allocation: ``nranks`` parts of ``part_bytes`` at ``base`` in this process, ``ident``
    the same on every rank. Holds its mapping only weakly: the arrays keep it alive."""

    __slots__ = ("base", "end", "part_bytes", "nranks", "ident", "_mm")

    def __init__(self, mm: mmap.mmap, base: int, part_bytes: int, nranks: int, ident: int) -> None:
        self.base, self.part_bytes, self.nranks, self.ident = base, part_bytes, nranks, ident
        self.end = base + part_bytes * nranks
        self._mm = weakref.ref(mm)

    @property
    def alive(self) -> bool:
        """Whether the mapping still exists (an array or view of it is alive somewhere here)."""
        return self._mm() is not None

    def holds(self, addr: int, nbytes: int) -> bool:
        """Whether ``nbytes`` at ``addr`` lie inside this region (and it is still mapped)."""
        return self.base <= addr and addr + nbytes <= self.end and self.alive


def address(arr: np.ndarray) -> int:
    """The address of an array's first element."""
    return int(arr.__array_interface__["data"][0])


def find(regions: List[Region], arr: np.ndarray) -> Optional[Region]:
    """The region holding ``arr`` (contiguous, not empty: an empty array's address may be any),
    or None. Forgets regions whose mapping is gone."""
    if any(not r.alive for r in regions):
        regions[:] = [r for r in regions if r.alive]
    if not arr.flags.c_contiguous or not arr.nbytes:
        return None
    at, nbytes = address(arr), arr.nbytes
    for region in regions:
        if region.holds(at, nbytes):
            return region
    return None


def allocate(rank: int, size: int, shape: Union[int, Sequence[int]], dtype: np.dtype,
             exchange: Callable[[bytes], List[bytes]]) -> tuple:
    """Collective: map a new region with a part of ``shape`` x ``dtype`` per rank; returns
    ``(array, region)``, the array this rank's part. ``exchange(bytes) -> [bytes per rank]`` is
    the team's allgather of short texts. Raises :class:`pycoll.MismatchError` on every rank when
    the ranks ask for different sizes, :class:`pycoll.TransportError` when a rank cannot map it."""
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise ValueError(f"alloc: shape must be non-negative integers, not {shape!r}")
    nbytes = math.prod(dims) * dtype.itemsize
    asked = exchange(str(nbytes).encode())
    if len(set(asked)) != 1:
        raise MismatchError("alloc: the ranks ask for different sizes (bytes by rank): "
                            + ", ".join(f"{r}: {a.decode()}" for r, a in enumerate(asked)))
    part = max(PAGE, -(-nbytes // PAGE) * PAGE)
    fd, error, mm = -1, "", None
    try:
        if rank == 0:
            fd = os.memfd_create("pycoll-alloc", os.MFD_CLOEXEC)
            os.ftruncate(fd, part * size)
            ident = int.from_bytes(os.urandom(8), "little") | 1
            info = f"{os.getpid()}:{fd}:{ident}".encode()
        else:
            info = b""
        pid, cfd, ident = (int(x) for x in exchange(info)[0].decode().split(":"))
        if rank != 0:
            try:
                fd = os.open(f"/proc/{pid}/fd/{cfd}", os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                error = f"rank {rank} cannot open rank 0's region: {exc}"
        if not error:
            mm = mmap.mmap(fd, part * size)
    finally:
        if fd >= 0 and rank != 0:
            os.close(fd)
    problems = [p.decode() for p in exchange(error.encode()) if p]  # everyone mapped it (or why not)
    if rank == 0 and fd >= 0:
        os.close(fd)
    if problems:
        raise TransportError("alloc: " + "; ".join(problems))
    assert mm is not None
    view = np.frombuffer(mm, np.uint8)  # (keeps the mapping alive, as the array made from it)
    region = Region(mm, address(view), part, size, ident)
    arr = view[rank * part:rank * part + nbytes].view(dtype).reshape(dims)
    return arr, region
