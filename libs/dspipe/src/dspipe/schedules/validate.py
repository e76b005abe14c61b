"""validate(schedule): every dependency, every message, and that the program finishes.

Checks, each fault reported with its rank and step on the rank-by-step grid:
- each stage lives on one rank (the placement's, when one is given); stages and micro-batches are
  numbered 0..n-1 without gaps;
- every (stage, micro-batch) has exactly one F and, when the schedule trains, exactly one B or one I
  and one W;
- on a rank: B/I(s,m) after F(s,m); W(s,m) after I(s,m); for neighbour stages on the same rank,
  F(s+1,m) after F(s,m) and B/I(s,m) after B/I(s+1,m);
- lowered programs (any action other than F/B/I/W): each cut between neighbour stages on different
  ranks has SEND_F after the F and RECV_F before the next stage's F (and SEND_B/RECV_B likewise for the
  backward), every send meets exactly one receive on the peer's rank and every receive one send, no
  message between stages of one rank, LOAD before the first and last stage's F, and when training
  REDUCE_TIED, REDUCE_GRAD of each stage after its backwards, and one STEP last;
- the program finishes: it is run with every action taking no time (sends never block, receives do,
  as lower.py defines), and a DeadlockError shows where each rank is stuck.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ..errors import ScheduleError
from .action import Action, Kind, Schedule
from .grid import render_grid
from .placement import Placement
from .simulate import Costs, simulate

_ZERO = Costs(forward=0, backward=0, input_grad=0, weight_grad=0)
MAX_LISTED = 20


def validate(schedule: Schedule, placement: Placement | None = None) -> None:
    """Raise ScheduleError (DeadlockError if it cannot finish) describing every fault; return None if sound."""
    _check_types(schedule)
    faults = _Faults(schedule)
    where = _index(schedule, faults)
    if placement is not None:
        _check_placement(schedule, placement, faults)
    if not faults.marks and not faults.notes:
        _check_counts(schedule, where, faults)
        _check_order(schedule, where, faults)
        if any(not a.kind.is_compute for actions in schedule for a in actions):
            _check_program(schedule, where, faults)
    faults.raise_if_any()
    simulate(schedule, _ZERO)  # raises DeadlockError, with the grid, if some rank can never go on


class _Faults:
    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.marks: dict[tuple[int, int], str] = {}
        self.notes: list[str] = []

    def at(self, rank: int, step: int, reason: str) -> None:
        self.marks.setdefault((rank, step), reason)

    def note(self, reason: str) -> None:
        self.notes.append(reason)

    def raise_if_any(self) -> None:
        if not self.marks and not self.notes:
            return
        count = len(self.marks) + len(self.notes)
        notes = self.notes[:MAX_LISTED] + ([f"... and {len(self.notes) - MAX_LISTED} more"]
                                           if len(self.notes) > MAX_LISTED else [])
        marks = dict(sorted(self.marks.items())[:MAX_LISTED])
        text = "\n".join([f"invalid pipeline schedule: {count} fault(s)", *notes, render_grid(self.schedule, marks)])
        if len(self.marks) > MAX_LISTED:
            text += f"\n... and {len(self.marks) - MAX_LISTED} more marked faults"
        raise ScheduleError(text)


def _check_types(schedule: Schedule) -> None:
    if not isinstance(schedule, list | tuple) or not schedule:
        raise ScheduleError(f"a schedule is a non-empty list with one list of actions per rank, got {schedule!r:.60}")
    for rank, actions in enumerate(schedule):
        if not isinstance(actions, list | tuple):
            raise ScheduleError(f"rank {rank}: expected a list of actions, got {type(actions).__name__}")
        for step, action in enumerate(actions):
            if not isinstance(action, Action):
                raise ScheduleError(f"rank {rank} step {step}: {action!r:.40} is not a dspipe.schedules.Action")


def _index(schedule: Schedule, faults: _Faults) -> dict[Action, tuple[int, int]]:
    """(rank, step) of every action; flags duplicates and stages spread over several ranks."""
    where: dict[Action, tuple[int, int]] = {}
    owner: dict[int, int] = {}
    for rank, actions in enumerate(schedule):
        for step, action in enumerate(actions):
            key = action
            if action.kind in (Kind.REDUCE_TIED, Kind.STEP):
                key = (action, rank)  # one per rank
            if key in where:
                r, s = where[key]
                faults.at(rank, step, f"{action} runs twice (first at rank {r} step {s})")
                continue
            where[key] = (rank, step)
            if action.stage is not None:
                first = owner.setdefault(action.stage, rank)
                if first != rank:
                    faults.at(rank, step, f"stage {action.stage} is on rank {first}, but {action} runs on rank {rank}")
    return where


def _check_placement(schedule: Schedule, placement: Placement, faults: _Faults) -> None:
    if len(schedule) != placement.ranks:
        faults.note(f"the schedule has {len(schedule)} ranks, the placement {placement.ranks}")
        return
    for rank, actions in enumerate(schedule):
        for step, action in enumerate(actions):
            if action.stage is None:
                continue
            if action.stage >= placement.stages:
                faults.at(rank, step, f"stage {action.stage} does not exist (0..{placement.stages - 1})")
            elif placement.rank_of[action.stage] != rank:
                faults.at(rank, step, f"stage {action.stage} belongs on rank {placement.rank_of[action.stage]}")


def _shape(schedule: Schedule) -> tuple[int, int, bool]:
    stages = {a.stage for actions in schedule for a in actions if a.kind.is_compute}
    micro_batches = {a.micro_batch for actions in schedule for a in actions if a.kind.is_compute}
    training = any(a.kind.is_backward for actions in schedule for a in actions)
    return max(stages, default=-1) + 1, max(micro_batches, default=-1) + 1, training


def _check_counts(schedule: Schedule, where: dict, faults: _Faults) -> None:
    stage_count, mb_count, training = _shape(schedule)
    seen_stages = {a.stage for actions in schedule for a in actions if a.kind.is_compute}
    seen_mbs = {a.micro_batch for actions in schedule for a in actions if a.kind.is_compute}
    if stage_count == 0:
        faults.note("the schedule has no compute action (F, B, I, W)")
        return
    missing_stages = sorted(set(range(stage_count)) - seen_stages)
    if missing_stages:
        faults.note(f"stages {missing_stages} have no action; stages must be numbered 0..{stage_count - 1}")
        return
    for rank, actions in enumerate(schedule):
        for step, a in enumerate(actions):
            if a.micro_batch is not None and a.micro_batch >= mb_count:
                faults.at(rank, step, f"micro-batch {a.micro_batch} has no compute action at all")
            if a.stage is not None and a.stage >= stage_count:
                faults.at(rank, step, f"stage {a.stage} has no compute action at all")
    missing_mbs = sorted(set(range(mb_count)) - seen_mbs)
    if missing_mbs:
        faults.note(f"micro-batches {missing_mbs} have no action; micro-batches must be numbered 0..{mb_count - 1}")
    for s in range(stage_count):
        for m in range(mb_count):
            f, b, i, w = (Action(k, s, m) in where for k in (Kind.F, Kind.B, Kind.I, Kind.W))
            if not f:
                faults.note(f"{Action(Kind.F, s, m)} is missing: every micro-batch needs a forward on every stage")
            if not training:
                continue
            if b and (i or w):
                faults.at(*where[Action(Kind.B, s, m)], f"stage {s} micro-batch {m} has a B and a split I/W backward")
            elif not b and not (i and w):
                lacking = "I and W" if not (i or w) else ("W" if i else "I")
                faults.note(f"stage {s} micro-batch {m} has no complete backward: B, or I and W (missing {lacking})")


def _check_order(schedule: Schedule, where: dict, faults: _Faults) -> None:
    """Dependencies between actions of the same rank must follow the rank's order."""
    for rank, actions in enumerate(schedule):
        for step, a in enumerate(actions):
            s, m = a.stage, a.micro_batch
            needs: list[Action] = []
            if a.kind in (Kind.B, Kind.I):
                needs = [Action(Kind.F, s, m), _input_grad(where, s + 1, m)]
            elif a.kind is Kind.W:
                needs = [Action(Kind.I, s, m)]
            elif a.kind is Kind.F and s > 0:
                needs = [Action(Kind.F, s - 1, m)]
            for need in needs:
                if need is None or need not in where:
                    continue
                need_rank, need_step = where[need]
                if need_rank == rank and need_step > step:
                    faults.at(rank, step, f"{a} runs before {need} (step {need_step}), which it needs")


def _input_grad(where: dict, s: int, m: int) -> Action | None:
    for kind in (Kind.B, Kind.I):
        if Action(kind, s, m) in where:
            return Action(kind, s, m)
    return None


def _check_program(schedule: Schedule, where: dict, faults: _Faults) -> None:
    stage_count, mb_count, training = _shape(schedule)
    rank_of = {a.stage: rank for rank, actions in enumerate(schedule) for a in actions if a.kind.is_compute}
    last = stage_count - 1

    def expect(action: Action, rank: int, before: Action | None = None, after: Action | None = None,
               why: str = "") -> None:
        if action not in where:
            anchor = before or after
            if anchor in where:
                faults.at(*where[anchor], f"{action} is missing on rank {rank} ({why})")
            else:
                faults.note(f"{action} is missing on rank {rank} ({why})")
            return
        at_rank, at_step = where[action]
        if before is not None and before in where and where[before][1] < at_step:
            faults.at(at_rank, at_step, f"{action} comes after {before}, which needs it ({why})")
        if after is not None and after in where and where[after][1] > at_step:
            faults.at(at_rank, at_step, f"{action} comes before {after}, which produces it ({why})")

    for s in range(last):
        if rank_of[s] == rank_of[s + 1]:
            continue
        cut = f"stages {s} and {s + 1} are on ranks {rank_of[s]} and {rank_of[s + 1]}"
        for m in range(mb_count):
            expect(Action(Kind.SEND_F, s, m), rank_of[s], after=Action(Kind.F, s, m), why=cut)
            expect(Action(Kind.RECV_F, s + 1, m), rank_of[s + 1], before=Action(Kind.F, s + 1, m), why=cut)
            if training:
                expect(Action(Kind.RECV_B, s, m), rank_of[s], before=_input_grad(where, s, m), why=cut)
                expect(Action(Kind.SEND_B, s + 1, m), rank_of[s + 1], after=_input_grad(where, s + 1, m), why=cut)
    for rank, actions in enumerate(schedule):
        loads = Counter()
        for step, a in enumerate(actions):
            if a.kind.is_comm:
                peer = a.peer
                if not 0 <= peer <= last:
                    faults.at(rank, step, f"{a} talks to stage {peer}, which does not exist (0..{last})")
                elif rank_of[peer] == rank:
                    faults.at(rank, step, f"{a}: stages {a.stage} and {peer} are both on rank {rank}; "
                                          f"they share tensors in memory, not messages")
                elif a.matching() not in where:
                    faults.at(rank, step, f"{a} has no matching {a.matching()} on rank {rank_of[peer]}")
            elif a.kind is Kind.LOAD:
                loads[a.micro_batch] += 1
        holds_ends = 0 in rank_of and (rank_of[0] == rank or rank_of[last] == rank)
        if holds_ends:
            for m in range(mb_count):
                first_f = min((where[Action(Kind.F, s, m)][1] for s in {0, last}
                               if rank_of[s] == rank and Action(Kind.F, s, m) in where), default=None)
                load = next((where[a][1] for a in (Action(Kind.LOAD, s, m) for s in {0, last}) if a in where), None)
                if load is None:
                    faults.note(f"rank {rank} holds stage 0 or {last} but never loads micro-batch {m} (LOAD)")
                elif first_f is not None and load > first_f:
                    faults.at(rank, load, f"micro-batch {m} is loaded after its first forward on rank {rank}")
        if training:
            _check_step(rank, actions, faults)


def _check_step(rank: int, actions: list[Action], faults: _Faults) -> None:
    steps = [i for i, a in enumerate(actions) if a.kind is Kind.STEP]
    if len(steps) != 1 or steps[0] != len(actions) - 1:
        faults.note(f"rank {rank} must end with exactly one STEP (found {len(steps)}, last action "
                    f"{actions[-1] if actions else None})")
    if not any(a.kind is Kind.REDUCE_TIED for a in actions):
        faults.note(f"rank {rank} has no REDUCE_TIED before its STEP")
    last_backward: dict[int, int] = defaultdict(lambda: -1)
    for i, a in enumerate(actions):
        if a.kind in (Kind.B, Kind.W):
            last_backward[a.stage] = i
    reduced = {a.stage: i for i, a in enumerate(actions) if a.kind is Kind.REDUCE_GRAD}
    for stage, i in last_backward.items():
        if stage not in reduced:
            faults.note(f"rank {rank} never reduces the gradients of stage {stage} (REDUCE_GRAD)")
        elif reduced[stage] < i:
            faults.at(rank, reduced[stage], f"gradients of stage {stage} reduced before its last backward (step {i})")
