"""Pipeline schedules as plain data: generators, placement, lowering, validation, simulation, traces.

No torch and no processes here. A schedule is `list[list[Action]]`: one list per pipeline rank, in the
order that rank runs its actions.
"""

from .action import COMPUTE_KINDS, Action, Kind, Schedule
from .placement import Placement, make_placement
from .trace import TraceEvent, TraceRecorder, read_trace, write_trace

__all__ = [
    "COMPUTE_KINDS",
    "Action",
    "Kind",
    "Placement",
    "Schedule",
    "TraceEvent",
    "TraceRecorder",
    "make_placement",
    "read_trace",
    "write_trace",
]
