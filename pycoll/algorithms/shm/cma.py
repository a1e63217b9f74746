"""What the single-copy (``cma``) segment collectives share: the check that the team's ranks may
read each other's memory. Not an algorithm itself (no ``NAME``)."""

from typing import Any

from pycoll.algorithms.shm import segment_of


def cma_segment_of(args: Any) -> Any:
    """The team's shared segment for a ``cma`` algorithm; ValueError (before anything is sent)
    when there is none, the call is tagged, or the ranks may not read each other's memory."""
    seg = segment_of(args)
    if not getattr(seg, "cma", False):
        raise ValueError(f"{args.coll}: algorithm 'cma' needs a team on one host whose ranks may read "
                         "each other's memory (process_vm_readv)")
    return seg
