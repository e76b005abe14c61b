"""An event-driven simulator of a schedule in one process: when each action runs, given its cost.

Each rank runs its list in order, one action at a time. An action starts when its rank is free and
its inputs exist:
- compute-only schedule: F(s,m) after F(s-1,m); B/I(s,m) after F(s,m) and after B/I(s+1,m); W(s,m)
  after I(s,m); across ranks a result arrives `comm` after the producing action ends.
- lowered schedule (see lower.py): a compute action waits for its local RECV when its neighbour stage
  is on another rank; RECV_x(s,m) ends no earlier than the matching SEND's end plus `comm`. Sends never
  block (isend); receives block (irecv + wait), the model `lower` proves safe.
An action whose input never comes (it is later in the same rank's list, on no rank, or behind a cycle)
stops its rank; when every unfinished rank is stopped the schedule deadlocks and a DeadlockError
prints the rank-by-step grid with each rank's stuck action marked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import DeadlockError, ScheduleError
from .action import Action, Kind, Schedule
from .grid import render_grid
from .timeline import Timeline
from .trace import TraceEvent

# Cost field name for each kind; Costs(forward=..., ...) or a mapping keyed by kind letter or field name.
_FIELD_OF_KIND = {
    Kind.F: "forward", Kind.B: "backward", Kind.I: "input_grad", Kind.W: "weight_grad",
    Kind.SEND_F: "send", Kind.SEND_B: "send", Kind.RECV_F: "recv", Kind.RECV_B: "recv",
    Kind.LOAD: "load", Kind.REDUCE_TIED: "reduce", Kind.REDUCE_GRAD: "reduce", Kind.STEP: "step",
}
_ALIASES = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight_grad"}


@dataclass(frozen=True)
class Costs:
    """How long each action takes (any unit: the simulator's times are in the same unit).

    `comm` is a message's latency: from the end of its send (or of the producing compute action in a
    compute-only schedule) to the moment the receiver can use it. `per_stage` overrides a kind's cost on
    one stage, keyed by (kind, stage), as measured costs do (see `Costs.from_trace`).
    """

    forward: float = 1.0
    backward: float = 2.0
    input_grad: float = 1.0
    weight_grad: float = 1.0
    comm: float = 0.0
    send: float = 0.0
    recv: float = 0.0
    load: float = 0.0
    reduce: float = 0.0
    step: float = 0.0
    per_stage: Mapping[tuple[Kind, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (*_ALIASES.values(), "comm", "send", "recv", "load", "reduce", "step"):
            _check_cost(name, getattr(self, name))
        for (kind, stage), value in self.per_stage.items():
            _check_cost(f"per_stage[{kind}, {stage}]", value)

    def of(self, action: Action) -> float:
        if action.stage is not None:
            override = self.per_stage.get((action.kind, action.stage))
            if override is not None:
                return override
        return getattr(self, _FIELD_OF_KIND[action.kind])

    @classmethod
    def from_mapping(cls, values: Mapping[str, float]) -> Costs:
        """`{"F": 1, "B": 2, "comm": 0.1}`: keys are kind letters F/B/I/W or field names."""
        fields = {}
        for key, value in values.items():
            name = _ALIASES.get(key, key)
            if name not in _FIELD_OF_KIND.values() and name != "comm":
                valid = ", ".join([*_ALIASES, "comm", "send", "recv", "load", "reduce", "step"])
                raise ScheduleError(f"unknown cost {key!r}; valid: {valid}")
            fields[name] = value
        return cls(**fields)

    @classmethod
    def from_trace(cls, events: Iterable[TraceEvent], **defaults: float) -> Costs:
        """Mean measured duration of each compute kind on each stage, for simulating a measured run."""
        sums: dict[tuple[Kind, int], list[float]] = {}
        for event in events:
            if event.action.kind.is_compute:
                sums.setdefault((event.action.kind, event.action.stage), []).append(event.duration)
        return cls(**defaults, per_stage={key: sum(v) / len(v) for key, v in sums.items()})


def _check_cost(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ScheduleError(f"cost {name} must be a finite number >= 0, got {value!r}")


def simulate(schedule: Schedule, costs: Costs | Mapping[str, float] | None = None) -> Timeline:
    """Run `schedule` (compute-only or lowered) on simulated ranks and return its Timeline
    (makespan, bubble, idle_fraction, peak_activations, events). Raises DeadlockError if it cannot finish."""
    if costs is None:
        costs = Costs()
    elif isinstance(costs, Mapping):
        costs = Costs.from_mapping(costs)
    elif not isinstance(costs, Costs):
        raise ScheduleError(f"costs must be a dspipe.schedules.Costs or a mapping, got {type(costs).__name__}")
    deps = Dependencies(schedule)
    ends: dict[tuple[int, Action], float] = {}
    events: list[TraceEvent] = []
    position = [0] * len(schedule)
    free_at = [0.0] * len(schedule)
    progressed = True
    while progressed:
        progressed = False
        for rank, actions in enumerate(schedule):
            while position[rank] < len(actions):
                action = actions[position[rank]]
                start = free_at[rank]
                for needed, latency_kind in deps.of(rank, action):
                    end = ends.get(needed)
                    if end is None:
                        break
                    start = max(start, end + (costs.comm if latency_kind else 0.0))
                else:
                    end = start + costs.of(action)
                    ends[(rank, action)] = free_at[rank] = end
                    events.append(TraceEvent(rank, action, start, end))
                    position[rank] += 1
                    progressed = True
                    continue
                break
    if any(position[r] < len(actions) for r, actions in enumerate(schedule)):
        raise _deadlock(schedule, position, deps, ends)
    return Timeline.of(events, ranks=len(schedule))


def _deadlock(schedule: Schedule, position: list[int], deps: Dependencies,
              ends: Mapping[tuple[int, Action], float]) -> DeadlockError:
    lines, marks = [], {}
    for rank, actions in enumerate(schedule):
        if position[rank] < len(actions):
            action = actions[position[rank]]
            waiting = [f"{needed[1]} on rank {needed[0]}" for needed, _ in deps.of(rank, action) if needed not in ends]
            lines.append(f"  rank {rank} is stuck at step {position[rank]} ({action}), waiting for "
                         f"{', '.join(waiting)}")
            marks[(rank, position[rank])] = "stuck"
    return DeadlockError("the schedule deadlocks: every unfinished rank waits for an action that never runs\n"
                         + "\n".join(lines) + "\n" + render_grid(schedule, marks))


class Dependencies:
    """What each action of a schedule must wait for: a list of ((rank, action), crosses_ranks)."""

    def __init__(self, schedule: Schedule) -> None:
        self.rank_of: dict[int, int] = {}
        self.lowered = False
        self.input_grad: dict[tuple[int, int], Action] = {}  # (stage, mb) -> its B or I
        self.load: dict[tuple[int, int], Action] = {}  # (rank, mb) -> LOAD
        for rank, actions in enumerate(schedule):
            for action in actions:
                if not isinstance(action, Action):
                    raise ScheduleError(f"rank {rank}: {action!r} is not a dspipe.schedules.Action")
                kind = action.kind
                if not kind.is_compute:
                    self.lowered = True
                if kind is Kind.LOAD:
                    self.load[(rank, action.micro_batch)] = action
                if kind.is_compute or kind is Kind.REDUCE_GRAD:
                    owner = self.rank_of.setdefault(action.stage, rank)
                    if owner != rank:
                        raise ScheduleError(f"stage {action.stage} has actions on rank {owner} and on rank {rank} "
                                            f"({action}); a stage lives on one rank")
                if kind in (Kind.B, Kind.I):
                    self.input_grad[(action.stage, action.micro_batch)] = action
        self.last_stage = max(self.rank_of, default=0)

    def _across(self, stage: int, action: Action, rank: int) -> tuple[tuple[int, Action], bool]:
        owner = self.rank_of.get(stage, -1)
        return (owner, action), owner != rank

    def of(self, rank: int, action: Action) -> list[tuple[tuple[int, Action], bool]]:
        kind, s, m = action.kind, action.stage, action.micro_batch
        same = self.rank_of.get
        if kind is Kind.F:
            needs = []
            if self.lowered and (s == 0 or s == self.last_stage) and (rank, m) in self.load:
                needs.append(((rank, self.load[(rank, m)]), False))
            if s > 0:
                if self.lowered and same(s - 1) != rank:
                    needs.append(((rank, Action(Kind.RECV_F, s, m)), False))
                else:
                    needs.append(self._across(s - 1, Action(Kind.F, s - 1, m), rank))
            return needs
        if kind in (Kind.B, Kind.I):
            needs = [((rank, Action(Kind.F, s, m)), False)]
            if s < self.last_stage:
                if self.lowered and same(s + 1) != rank:
                    needs.append(((rank, Action(Kind.RECV_B, s, m)), False))
                else:
                    downstream = self.input_grad.get((s + 1, m), Action(Kind.B, s + 1, m))
                    needs.append(self._across(s + 1, downstream, rank))
            return needs
        if kind is Kind.W:
            return [((rank, Action(Kind.I, s, m)), False)]
        if kind is Kind.SEND_F:
            return [((rank, Action(Kind.F, s, m)), False)]
        if kind is Kind.SEND_B:
            return [((rank, self.input_grad.get((s, m), Action(Kind.B, s, m))), False)]
        if kind.is_recv:
            send = action.matching()
            return [((same(send.stage, -1), send), True)]
        return []  # LOAD, REDUCE_*, STEP: their place in the rank's order is their only constraint
