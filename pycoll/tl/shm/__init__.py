"""The shared-memory transport: one segment per node-local team, collectives in native code."""

from pycoll.tl.shm.segment import ShmSegment, shm_available

__all__ = ["ShmSegment", "shm_available"]
