"""Pipeline schedules as plain data: generators, placement, lowering, validation, simulation, traces.

No torch and no processes here. A schedule is `list[list[Action]]`: one list per pipeline rank, in the
order that rank runs its actions. `stages` passed to a generator is the pipeline's depth in ranks;
actions carry global stage indices (a rank may hold several stages).

    compute = build_schedule("zb_h1", stages=4, micro_batches=8)   # or SCHEDULES["zb_h1"](4, 8)
    layout = placement("zb_h1", ranks=4)                            # which rank holds which stage
    program = lower(compute, layout)                                # + LOAD, SEND/RECV, REDUCE_*, STEP
    validate(program, layout)                                       # raises ScheduleError with the grid
    simulate(compute).bubble                                        # (p-1)/(3m) = 0.125
"""

from ..errors import DeadlockError, ScheduleError
from .action import COMPUTE_KINDS, Action, Kind, Schedule
from .dualpipev import dualpipev
from .generators import gpipe, inference, interleaved_1f1b, one_f_one_b
from .lower import lower, message_tag
from .placement import Placement, make_placement
from .registry import SCHEDULES, build_schedule, is_training, placement, schedule_name, stages_per_rank
from .simulate import Costs, simulate
from .timeline import Timeline
from .trace import TraceEvent, TraceRecorder, read_trace, write_trace
from .validate import validate
from .zero_bubble import zb_h1, zbv

__all__ = [
    "COMPUTE_KINDS",
    "SCHEDULES",
    "Action",
    "Costs",
    "DeadlockError",
    "Kind",
    "Placement",
    "Schedule",
    "ScheduleError",
    "Timeline",
    "TraceEvent",
    "TraceRecorder",
    "build_schedule",
    "dualpipev",
    "gpipe",
    "inference",
    "interleaved_1f1b",
    "is_training",
    "lower",
    "make_placement",
    "message_tag",
    "one_f_one_b",
    "placement",
    "read_trace",
    "schedule_name",
    "simulate",
    "stages_per_rank",
    "validate",
    "write_trace",
    "zb_h1",
    "zbv",
]
