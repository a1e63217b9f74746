"""pycoll.sim: run the real collective algorithms of thousands of ranks on one machine, against a
network model.

Each rank's program is recorded from the algorithm pycoll runs (:mod:`pycoll.sim.programs`, through
:mod:`pycoll.lower`) and a discrete-event simulation runs the set on a :class:`Machine`
(:mod:`pycoll.sim.engine`): messages carry sizes, not payloads, and the clock jumps from one
completion to the next. :mod:`pycoll.sim.formulas` gives the closed forms the model must agree
with; ``pycoll sim`` is the command line (:mod:`pycoll.sim.cli`).
"""

from pycoll.sim.engine import Compact, Result, run
from pycoll.sim.machine import Machine, load
from pycoll.sim.programs import programs

__all__ = ["Compact", "Machine", "Result", "load", "programs", "run"]
