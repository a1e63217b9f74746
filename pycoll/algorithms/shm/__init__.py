"""Algorithms for ranks on one host: collectives run by the native state machine of the node's
shared segment (``args.shared``; ``*_shm``: allreduce, bcast, barrier, reduce, allgather(v),
reduce_scatter(v)) and the single-copy allgather(v) that reads peers' memory (``cma``).

They need the compiled native module (``pycoll._native``, through :mod:`pycoll.native`), which a
checkout without the native build lacks. So they import it inside ``build`` or the methods that
use it, never at the top of a module: the registry (:mod:`pycoll.algorithms`) imports and lists
these modules anyway, and only building one fails there (a team without the native build has no
segment to run them on).
"""

from typing import Any


def segment_of(args: Any) -> Any:
    """The team's shared segment for a ``*_shm`` algorithm; ValueError (before anything is sent)
    when there is none, or when the call is tagged: segment collectives run in posting order, so
    they cannot be matched by tag."""
    if args.shared is None or args.tag is not None:
        algorithm = args.name.partition(":")[2].partition("@")[0] or "shm"  # (the name is coll:alg@rank)
        raise ValueError(f"{args.coll}: algorithm {algorithm!r} needs an untagged call on a team whose "
                         "ranks share a host (and PYCOLL_TLS allowing shm)")
    return args.shared
