"""Memory every rank of a host's team maps: arrays made by ``team.alloc`` that the ranks read and
write directly (the ``mapped`` allreduce reduces straight out of its peers' inputs and writes
straight into their outputs, one copy's worth of memory traffic).

A region is one shared mapping of ``nranks`` parts, rank r's part at ``base + r * part_bytes`` in
every process; rank r's array is its own part. Rank 0 makes it (an anonymous memfd, mode 0600: the
user's alone), the others open it through ``/proc/<pid>/fd`` as the segment does; it lives as long
as an array (or any view of it) does in some process, and no file remains anywhere.
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


def huge_pages(mm: mmap.mmap) -> None:
    """Ask for transparent huge pages on a shared mapping (where the kernel allows them for shared
    memory: ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` ``advise`` or more): a rank that
    streams through its peers' parts with 4 KiB pages misses the TLB at every page."""
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # not allowed here: 4 KiB pages


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
    the team's allgather of short texts. Raises on every rank alike: ValueError when a rank's
    shape is not one, :class:`pycoll.MismatchError` when the ranks ask for different sizes,
    :class:`pycoll.TransportError` when a rank cannot make or map it."""
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    bad = any(not isinstance(d, (int, np.integer)) or d < 0 for d in dims)
    nbytes = 0 if bad else math.prod(dims) * dtype.itemsize
    asked = exchange(b"!" if bad else str(nbytes).encode())  # (a rank's bad shape: every rank raises)
    if b"!" in asked:
        ranks = [r for r, a in enumerate(asked) if a == b"!"]
        raise ValueError(f"alloc: the shape must be non-negative integers; ranks {ranks} gave another "
                         f"(this rank: {shape!r})")
    if len(set(asked)) != 1:
        raise MismatchError("alloc: the ranks ask for different sizes (bytes by rank): "
                            + ", ".join(f"{r}: {a.decode()}" for r, a in enumerate(asked)))
    part = max(PAGE, -(-nbytes // PAGE) * PAGE)
    fd, error, mm = -1, "", None
    try:
        info = b""
        if rank == 0:  # (a failure here is every rank's: the others learn it from the exchange)
            try:
                fd = os.memfd_create("pycoll-alloc", os.MFD_CLOEXEC)
                os.fchmod(fd, 0o600)  # (a memfd is made 0777: the user's alone, as the segment)
                os.ftruncate(fd, part * size)
                ident = int.from_bytes(os.urandom(8), "little") | 1
                info = f"{os.getpid()}:{fd}:{ident}".encode()
            except OSError as exc:
                info = f"!rank 0 cannot make a region of {part * size} bytes: {exc}".encode()
        made = exchange(info)[0].decode()
        if made.startswith("!"):
            raise TransportError("alloc: " + made[1:])
        pid, cfd, ident = (int(x) for x in made.split(":"))
        try:
            if rank != 0:
                fd = os.open(f"/proc/{pid}/fd/{cfd}", os.O_RDWR | os.O_CLOEXEC)
            mm = mmap.mmap(fd, part * size)
            huge_pages(mm)
        except OSError as exc:
            error = f"rank {rank} cannot map rank 0's region: {exc}"
    finally:
        if fd >= 0 and rank != 0:
            os.close(fd)
    problems = [p.decode() for p in exchange(error.encode()) if p]  # everyone mapped it (or why not)
    if rank == 0 and fd >= 0:
        os.close(fd)
    if problems:
        if mm is not None:
            mm.close()
        raise TransportError("alloc: " + "; ".join(problems))
    assert mm is not None
    view = np.frombuffer(mm, np.uint8)  # (keeps the mapping alive, as the array made from it)
    region = Region(mm, address(view), part, size, ident)
    arr = view[rank * part:rank * part + nbytes].view(dtype).reshape(dims)
    return arr, region
