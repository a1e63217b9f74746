"""Schedules as programs: lower an algorithm's point-to-point steps to a flat per-rank program.

- :mod:`pycoll.lower.program`: the program form (instructions, buffers, JSON, checks);
- :mod:`pycoll.lower.record`: lowering, by recording what an algorithm does on a rank;
- :mod:`pycoll.lower.verify`: :func:`lower`, recorded on every rank and checked bit for bit;
- :mod:`pycoll.lower.execute`: running a program as one engine task.
"""

from typing import Any

from pycoll.lower.execute import ProgramTask, run_program
from pycoll.lower.program import Instr, Program, ProgramError, check, check_set, from_json, loads
from pycoll.lower.record import NotLowerable


def __getattr__(name: str) -> Any:
    """``lower`` (from :mod:`pycoll.lower.verify`, which needs the team layer: loaded when first
    asked for, as the planner, which the team layer uses, imports this package)."""
    if name == "lower":
        from pycoll.lower.verify import lower  # noqa: PLC0415

        return lower
    raise AttributeError(f"module 'pycoll.lower' has no attribute {name!r}")

__all__ = ["Instr", "NotLowerable", "Program", "ProgramError", "ProgramTask", "check", "check_set",
           "from_json", "loads", "lower", "run_program"]
