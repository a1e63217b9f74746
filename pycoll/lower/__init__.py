"""Schedules as programs: lower an algorithm's point-to-point steps to a flat per-rank program.

- :mod:`pycoll.lower.program`: the program form (instructions, buffers, JSON, checks);
- :mod:`pycoll.lower.record`: lowering, by recording what an algorithm does on every rank;
- :mod:`pycoll.lower.execute`: running a program as one engine task.
"""

from pycoll.lower.execute import ProgramTask, run_program
from pycoll.lower.program import Instr, Program, ProgramError, check, check_set, from_json, loads
from pycoll.lower.record import NotLowerable, lower

__all__ = ["Instr", "NotLowerable", "Program", "ProgramError", "ProgramTask", "check", "check_set",
           "from_json", "loads", "lower", "run_program"]
