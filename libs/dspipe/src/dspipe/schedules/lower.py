"""Lowering: a compute-only schedule becomes each rank's full program, with communication and the
engine's actions.

The rule, per rank, in the rank's compute order:
- F(s, m): LOAD(s, m) first if this rank holds the first or the last stage and has not loaded m yet (the
  inputs for stage 0, the labels for the loss); RECV_F(s, m) right before it if stage s-1 is on another
  rank; SEND_F(s, m) right after it if stage s+1 is on another rank.
- B or I (s, m): RECV_B(s, m) right before it if stage s+1 is on another rank; SEND_B(s, m) right after
  it if stage s-1 is on another rank. W needs no message.
- Stages on the same rank exchange nothing: the runtime hands the tensor over in memory.
- When the schedule trains: REDUCE_TIED, then REDUCE_GRAD(s) for each stage of the rank, then STEP.

The execution model the runtime must keep, which `validate` checks by running the program: a send never
blocks (isend, its handle waited at the end of the batch at the latest); a receive blocks (irecv posted
at that point or earlier, waited right there). Messages are matched by tag (`message_tag`), never by
arrival order, so no order between different messages is assumed. Under this model a program can only
hang if a receive waits for a send that its own rank, directly or through other ranks, holds back;
running the program with every action taking no time finds any such cycle.
"""

from __future__ import annotations

from ..errors import ScheduleError
from .action import Action, Kind, Schedule
from .placement import Placement

MAX_TAG_STAGES = 1024
MAX_TAG = (1 << 31) - 1


def lower(schedule: Schedule, placement: Placement) -> Schedule:
    """Each rank's program: the compute actions of `schedule` with loads, sends, receives and the step."""
    if not isinstance(placement, Placement):
        raise ScheduleError(f"lower needs a dspipe.schedules.Placement, got {type(placement).__name__}")
    if len(schedule) != placement.ranks:
        raise ScheduleError(f"the schedule has {len(schedule)} rank lists but the placement has "
                            f"{placement.ranks} ranks")
    last = placement.stages - 1
    training = any(a.kind.is_backward for actions in schedule for a in actions)
    program: Schedule = []
    for rank, actions in enumerate(schedule):
        ops: list[Action] = []
        loaded: set[int] = set()
        for action in actions:
            _check_compute(action, rank, placement)
            s, m = action.stage, action.micro_batch
            before_cut = s > 0 and not placement.same_rank(s - 1, s)  # the previous stage is elsewhere
            after_cut = s < last and not placement.same_rank(s, s + 1)  # the next stage is elsewhere
            if action.kind is Kind.F:
                if s in (0, last) and m not in loaded:
                    ops.append(Action(Kind.LOAD, s, m))
                    loaded.add(m)
                ops += [Action(Kind.RECV_F, s, m)] if before_cut else []
                ops.append(action)
                ops += [Action(Kind.SEND_F, s, m)] if after_cut else []
            elif action.kind in (Kind.B, Kind.I):
                ops += [Action(Kind.RECV_B, s, m)] if after_cut else []
                ops.append(action)
                ops += [Action(Kind.SEND_B, s, m)] if before_cut else []
            else:
                ops.append(action)
        if training:
            ops.append(Action(Kind.REDUCE_TIED))
            ops += [Action(Kind.REDUCE_GRAD, s) for s in placement.stages_of(rank)]
            ops.append(Action(Kind.STEP))
        program.append(ops)
    return program


def _check_compute(action: object, rank: int, placement: Placement) -> None:
    if not isinstance(action, Action) or not action.kind.is_compute:
        raise ScheduleError(f"rank {rank}: lower takes compute actions only (F, B, I, W), got {action!r}")
    if not 0 <= action.stage < placement.stages:
        raise ScheduleError(f"rank {rank}: {action} names stage {action.stage}, outside 0..{placement.stages - 1}")
    if placement.rank_of[action.stage] != rank:
        raise ScheduleError(f"rank {rank}: {action} belongs to rank {placement.rank_of[action.stage]} under the "
                            f"{placement.shape} placement of {placement.stages} stages on {placement.ranks} ranks")


def message_tag(action: Action) -> int:
    """A tag shared by a send and its receive, unique among a batch's messages between any two ranks:
    (micro_batch * 2 + direction) * 1024 + sending stage, direction 0 for activations, 1 for gradients."""
    direction, sender, micro_batch = action.message_key()
    tag = (micro_batch * 2 + (direction == "B")) * MAX_TAG_STAGES + sender
    if sender >= MAX_TAG_STAGES or tag > MAX_TAG:
        raise ScheduleError(f"{action}: stage {sender} or micro-batch {micro_batch} too large for a message tag "
                            f"(stages < {MAX_TAG_STAGES}, micro-batches < {MAX_TAG // (2 * MAX_TAG_STAGES)})")
    return tag
