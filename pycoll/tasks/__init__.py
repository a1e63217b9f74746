"""Tasks and schedules: what a collective is built from."""

from pycoll.tasks.p2p import RecvTask, SendTask
from pycoll.tasks.pipelined import PipelinedSchedule, PipelineOrder
from pycoll.tasks.reduce import ReduceTask
from pycoll.tasks.schedule import Schedule
from pycoll.tasks.task import CopyTask, FunctionTask, Task, TaskState

__all__ = ["CopyTask", "FunctionTask", "PipelineOrder", "PipelinedSchedule", "RecvTask", "ReduceTask",
           "Schedule", "SendTask", "Task", "TaskState"]
