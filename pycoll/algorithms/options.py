"""Algorithm options: how an algorithm declares the options it takes, and the one helper that
reads them.

A caller passes options as keyword arguments of a collective (``team.allreduce(buf,
algorithm="ring", fragment_bytes=256 << 10)``); the team hands them to the algorithm as
``args.options``. Every algorithm module declares ``OPTIONS = {name: Option(...)}`` (empty when it
takes none) and its ``build`` starts with ``opts = options(args, OPTIONS)``: defaults filled in,
values checked, and a ``ValueError`` naming the known options for an unknown one, raised while the
collective is built, so before anything is sent.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Dict, Mapping

from pycoll.algorithms.base import CollArgs


@dataclass(frozen=True)
class Option:
    """An integer option of an algorithm: its default, its smallest allowed value and what it
    changes (shown to users)."""

    default: int
    help: str
    minimum: int = 1


def options(args: CollArgs, known: Mapping[str, Option]) -> Dict[str, int]:
    """The options of this call: ``args.options`` checked against ``known`` (an algorithm's
    ``OPTIONS``), with the defaults of those not given. Raises ``ValueError`` for an unknown
    option (naming the known ones), a value that is not an integer, or one below its minimum."""
    given = args.options
    values = {name: opt.default for name, opt in known.items()}
    if not given:
        return values
    algorithm = args.name.split("@")[0] or args.coll
    for name, value in given.items():
        opt = known.get(name)
        if opt is None:
            takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
            raise ValueError(f"{algorithm}: unknown option {name!r} ({takes})")
        try:  # ints and numpy integers; not floats, strings, None or bools
            number = operator.index(value) if not isinstance(value, bool) else None
        except TypeError:
            number = None
        if number is None or number < opt.minimum:
            raise ValueError(f"{algorithm}: option {name}={value!r} must be an integer >= {opt.minimum}")
        values[name] = number
    return values


#: The option of the k-nomial trees (bcast, reduce, gather, scatter ``knomial``).
TREE_OPTIONS: Dict[str, Option] = {
    "radix": Option(2, "children per level of the tree (k): log_k(n) rounds", minimum=2),
}
