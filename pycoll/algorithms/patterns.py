"""The communication patterns several algorithms share, named once.

* **k-nomial tree** (binomial for radix 2), rooted at vrank 0 (``vrank = (rank - root) % n``):
  :func:`knomial_parent`, :func:`knomial_levels` (children by distance), :func:`knomial_tree`
  (children with their subtrees) and :func:`subtree_span` (the binomial case in O(1)). Used by
  bcast, reduce, gather and scatter ``knomial``, bcast ``scatter_allgather`` and reduce
  ``rs_gather``.
* **recursive doubling with the fold** of a team that is not a power of two: :func:`fold`
  (who sits out, who stands for two ranks) and :func:`doubling_peers` (the partner of every
  step). Used by allreduce and allgather ``rd`` and reduce_scatter ``rhalving`` (which walks the
  same partners in the other order).
* **pipelined fragments**: :func:`fragment_elems`, :func:`fragment_count`,
  :func:`fragment_ranges` cut a buffer; :func:`interleave` is the depth window of a two-phase
  pipeline (a :class:`~pycoll.tasks.PipelinedSchedule` is the window of a one-phase one). Used by
  allreduce ``ring`` and the hierarchical algorithms.

All of them are worked out when a task is built (a task is reused for every call of the same
shape), never per message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

# ---------------------------------------------------------------------- k-nomial tree


def knomial_parent(v: int, n: int, radix: int) -> Tuple[Optional[int], int]:
    """``(parent, dist)`` of vrank ``v`` in the k-nomial tree of ``n`` vranks rooted at 0.

    ``dist`` is ``radix**k`` for the lowest non-zero base-``radix`` digit ``k`` of ``v``, whose
    parent is ``v - digit * dist``; for the root (parent None) it is the first power of ``radix``
    >= ``n``. Either way ``v``'s subtree is the vranks ``[v, min(v + dist, n))``."""
    dist = 1
    while dist < n:
        digit = (v // dist) % radix
        if digit:
            return v - digit * dist, dist
        dist *= radix
    return None, dist


def knomial_levels(v: int, n: int, radix: int, dist: int) -> List[Tuple[int, List[int]]]:
    """The children of vrank ``v`` by level, nearest level first: ``[(d, [v + d, v + 2d, ...
    v + (radix-1)d]), ...]`` for ``d = 1, radix, radix**2, ...`` below ``dist`` (from
    :func:`knomial_parent`), without the vranks >= ``n`` (so a level may be empty). The child
    ``v + j*d`` heads the subtree ``[v + j*d, min(v + j*d + d, n))``."""
    levels = []
    d = 1
    while d < dist:
        levels.append((d, [v + j * d for j in range(1, radix) if v + j * d < n]))
        d *= radix
    return levels


def knomial_tree(v: int, n: int, radix: int) -> Tuple[Optional[int], List[Tuple[int, int]], int]:
    """``(parent, [(child, child_end), ...], end)`` of vrank ``v``: its subtree is the vranks
    ``[v, end)``, a child's ``[child, child_end)``; children come farthest (largest subtree)
    first; ``parent`` is None for the root."""
    parent, dist = knomial_parent(v, n, radix)
    children = [(c, min(c + d, n)) for d, kids in reversed(knomial_levels(v, n, radix, dist))
                for c in reversed(kids)]
    return parent, children, min(v + dist, n)


def subtree_span(v: int, n: int) -> int:
    """Vranks under ``v`` (itself included) in the binomial tree (radix 2) rooted at vrank 0,
    before clipping at ``n``: the lowest set bit of ``v``, or the next power of two >= n for the
    root (``knomial_parent(v, n, 2)[1]`` in O(1)); the parent of ``v > 0`` is ``v - span``."""
    if v:
        return v & -v
    span = 1
    while span < n:
        span <<= 1
    return span


# ---------------------------------------------------------------------- recursive doubling

#: Roles in the fold: hands its data to ``rank + 1`` and sits out, stands for ``rank - 1`` and
#: itself, or takes part on its own.
IDLE, PROXY, PLAIN = "idle", "proxy", "plain"


@dataclass(frozen=True)
class Fold:
    """Where a rank stands in recursive doubling on ``n`` ranks (as MPICH does): with ``p`` the
    largest power of two <= n and ``rem = n - p``, the even ranks among the first ``2*rem`` are
    ``idle`` (they hand their data to the odd neighbour, a ``proxy``, and get the result back at
    the end); the ``p`` remaining ranks are the new ranks ``0..p-1`` that double."""

    role: str
    newrank: int  # this rank's new rank (an idle rank: its proxy's)
    p: int
    rem: int

    def rank_of(self, newrank: int) -> int:
        """The rank that works for new rank ``newrank``."""
        return newrank * 2 + 1 if newrank < self.rem else newrank + self.rem

    def first_rank(self, newrank: int) -> int:
        """The first of the ranks new rank ``newrank`` stands for (two ranks below ``rem``, one
        above), so new ranks ``[i, j)`` stand for ranks ``[first_rank(i), first_rank(j))``;
        ``first_rank(p) == n``."""
        return newrank + min(newrank, self.rem)

    @property
    def last_step(self) -> int:
        """The step after the doubling (steps ``1..log2(p)``): a proxy hands the result back."""
        return self.p.bit_length()


def fold(rank: int, n: int) -> Fold:
    """``rank``'s place in the fold of a team of ``n``."""
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    if rank < 2 * rem:
        return Fold(IDLE if rank % 2 == 0 else PROXY, rank // 2, p, rem)
    return Fold(PLAIN, rank - rem, p, rem)


def doubling_peers(f: Fold) -> List[Tuple[int, int]]:
    """``[(peer rank, step), ...]`` of the doubling: in step ``k`` (from 1) the new rank that
    differs in bit ``k - 1``. Empty for an idle rank."""
    if f.role == IDLE:
        return []
    steps, mask, step = [], 1, 1
    while mask < f.p:
        steps.append((f.rank_of(f.newrank ^ mask), step))
        mask <<= 1
        step += 1
    return steps


# ---------------------------------------------------------------------- pipelined fragments


def fragment_elems(fragment_bytes: int, elem_bytes: int) -> int:
    """Elements per fragment (at least one) for fragments of ``fragment_bytes``, where one
    element index covers ``elem_bytes`` (the itemsize, or ``n * itemsize`` for a fragment taken
    from each of ``n`` blocks)."""
    return max(1, fragment_bytes // max(1, elem_bytes))


def fragment_count(count: int, per: int) -> int:
    """Fragments of ``per`` elements in ``count`` (the last one shorter)."""
    return -(-count // per)


def fragment_ranges(count: int, per: int) -> List[Tuple[int, int]]:
    """``(lo, hi)`` element ranges of the fragments of ``count`` elements, ``per`` each; one
    empty fragment when ``count`` is 0 (a collective still runs once)."""
    if count == 0:
        return [(0, 0)]
    return [(lo, min(count, lo + per)) for lo in range(0, count, per)]


def interleave(n_frags: int, lag: int, first: Callable[[int], Any], second: Callable[[int], Any]) -> None:
    """Build the two phases of ``n_frags`` fragments in the order every rank will post them:
    ``first`` of fragments 0..lag-1, then ``second(f)`` after ``first(f + lag)``, then the
    remaining seconds; ``lag`` (the depth) fragments' first phases run ahead of the seconds."""
    for f in range(n_frags):
        first(f)
        if f >= lag:
            second(f - lag)
    for f in range(max(0, n_frags - lag), n_frags):
        second(f)
