"""pycoll: a UCC-style collective task/schedule engine for Python.

A collective is a schedule (a DAG of tasks subscribed to each other's events); one progress engine
per process starts work by priority while credit allows; transports move the bytes.
"""

from pycoll import libenv
from pycoll.engine import Context, Request, get_context, wait_all
from pycoll.errors import (
    BufferError,
    CanceledError,
    ClosedError,
    ConfigError,
    MismatchError,
    PeerLostError,
    PycollError,
    RevokedError,
    ThreadError,
    TimeoutError,
    TransportError,
)
from pycoll.events import Event, EventManager
from pycoll.ops import ReduceOp
from pycoll.tasks import PipelinedSchedule, PipelineOrder, Schedule, Task, TaskState
from pycoll.team import Team, local_teams

libenv.apply()  # (no import above starts MPI or UCX: an MPI started after pycoll's import reads them)

__version__ = "0.1.0"

__all__ = [
    "BufferError", "CanceledError", "ClosedError", "ConfigError", "Context", "Event", "EventManager",
    "MismatchError", "PeerLostError", "PipelineOrder", "PipelinedSchedule", "PycollError", "ReduceOp",
    "Request", "RevokedError", "Schedule", "Task", "TaskState", "Team", "ThreadError", "TimeoutError",
    "TransportError",
    "get_context", "local_teams", "wait_all", "__version__",
]
