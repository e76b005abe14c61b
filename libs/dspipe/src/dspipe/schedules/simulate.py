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
    _by_kind: dict[str, float] = field(init=False, repr=False, compare=False)
    _by_stage: dict[tuple[str, int], float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in (*_ALIASES.values(), "comm", "send", "recv", "load", "reduce", "step"):
            _check_cost(name, getattr(self, name))
        for key, value in self.per_stage.items():
            if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], Kind) and isinstance(key[1], int)):
                raise ScheduleError(f"per_stage keys are (Kind, stage) pairs, got {key!r}")
            _check_cost(f"per_stage[{key[0].value}, {key[1]}]", value)
        # Lookups by the kind's value string: the simulator asks once per action.
        object.__setattr__(self, "_by_kind", {k.value: getattr(self, f) for k, f in _FIELD_OF_KIND.items()})
        object.__setattr__(self, "_by_stage", {(k.value, s): v for (k, s), v in self.per_stage.items()})

    def of(self, action: Action) -> float:
        kind = action.kind._value_
        if self._by_stage and action.stage is not None:
            override = self._by_stage.get((kind, action.stage))
            if override is not None:
                return override
        return self._by_kind[kind]

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
    durations = [[costs.of(a) for a in actions] for actions in schedule]
    starts = execute(schedule, durations, costs.comm)
    # Built in rank order with each rank's starts increasing: already the order Timeline keeps.
    events = tuple(TraceEvent(rank, action, starts[rank][i], starts[rank][i] + durations[rank][i])
                   for rank, actions in enumerate(schedule) for i, action in enumerate(actions))
    return Timeline(events, len(schedule))


def execute(schedule: Schedule, durations: list[list[float]], comm: float) -> list[list[float]]:
    """Each action's start time, given each action's duration and the messages' latency; DeadlockError
    if the ranks cannot all finish."""
    plan = Plan(schedule)
    ends: dict[Key, float] = {}
    starts = [[0.0] * len(actions) for actions in schedule]
    position = [0] * len(schedule)
    free_at = [0.0] * len(schedule)
    progressed = True
    while progressed:  # each pass runs every rank as far as its inputs allow
        progressed = False
        for rank, keys in enumerate(plan.keys):
            needs, step = plan.needs[rank], position[rank]
            while step < len(keys):
                start = free_at[rank]
                for needed, crosses in needs[step]:
                    end = ends.get(needed)
                    if end is None:
                        break
                    if crosses:
                        end += comm
                    if end > start:
                        start = end
                else:
                    starts[rank][step] = start
                    ends[keys[step]] = free_at[rank] = start + durations[rank][step]
                    step += 1
                    continue
                break
            progressed |= step != position[rank]
            position[rank] = step
    if any(position[r] < len(actions) for r, actions in enumerate(schedule)):
        raise _deadlock(schedule, position, plan, ends)
    return starts


def _deadlock(schedule: Schedule, position: list[int], plan: Plan, ends: Mapping[Key, float]) -> DeadlockError:
    lines, marks = [], {}
    for rank, actions in enumerate(schedule):
        step = position[rank]
        if step < len(actions):
            waiting = [f"{_text(key)} on rank {key[0]}" if key[0] >= 0 else f"{_text(key)} (on no rank)"
                       for key, _ in plan.needs[rank][step] if key not in ends]
            lines.append(f"  rank {rank} is stuck at step {step} ({actions[step]}), waiting for {', '.join(waiting)}")
            marks[(rank, step)] = "stuck: waits for " + ", ".join(waiting)
    return DeadlockError("the schedule deadlocks: every unfinished rank waits for an action that never runs\n"
                         + "\n".join(lines) + "\n" + render_grid(schedule, marks))


# An action's identity in the simulator: (rank, kind letter(s), stage, micro-batch); plain tuples hash fast.
Key = tuple[int, str, int | None, int | None]
_F, _B, _I, _W = "F", "B", "I", "W"


def _text(key: Key) -> str:
    _, kind, stage, mb = key
    return f"{'' if stage is None else stage}{kind}{'' if mb is None else mb}"


class Plan:
    """Each action's key and what it waits for: a list of (key, crosses_ranks) per action, per rank."""

    def __init__(self, schedule: Schedule) -> None:
        self.rank_of: dict[int, int] = {}
        self.lowered = False
        backward_kind: dict[tuple[int, int], str] = {}  # (stage, mb) -> "B" or "I"
        loads: dict[tuple[int, int], int] = {}  # (rank, mb) -> the stage its LOAD names
        self.keys: list[list[Key]] = []
        for rank, actions in enumerate(schedule):
            keys = []
            for action in actions:
                if not isinstance(action, Action):
                    raise ScheduleError(f"rank {rank}: {action!r} is not a dspipe.schedules.Action")
                kind = action.kind._value_
                key = (rank, kind, action.stage, action.micro_batch)
                keys.append(key)
                if kind in _COMPUTE or kind == "REDUCE_GRAD":
                    owner = self.rank_of.setdefault(action.stage, rank)
                    if owner != rank:
                        raise ScheduleError(f"stage {action.stage} has actions on rank {owner} and on rank {rank} "
                                            f"({action}); a stage lives on one rank")
                else:
                    self.lowered = True
                if kind in (_B, _I):
                    backward_kind[(action.stage, action.micro_batch)] = kind
                elif kind == "LOAD":
                    loads[(rank, action.micro_batch)] = action.stage
            if len(set(keys)) != len(keys):
                twice = next(a for a, k in zip(actions, keys) if keys.count(k) > 1)
                raise ScheduleError(f"rank {rank} runs {twice} more than once")
            self.keys.append(keys)
        last = max(self.rank_of, default=0)
        owner = self.rank_of.get
        lowered = self.lowered

        def at(stage: int, kind: str, mb: int, rank: int) -> tuple[Key, bool]:
            where = owner(stage, -1)
            return (where, kind, stage, mb), where != rank

        self.needs: list[list[list[tuple[Key, bool]]]] = []
        for rank, keys in enumerate(self.keys):
            rank_needs = []
            for _, kind, s, m in keys:
                needs: list[tuple[Key, bool]] = []
                if kind == _F:
                    if lowered and (s == 0 or s == last) and (rank, m) in loads:
                        needs.append(((rank, "LOAD", loads[(rank, m)], m), False))
                    if s > 0:
                        if lowered and owner(s - 1) != rank:
                            needs.append(((rank, "RECV_F", s, m), False))
                        else:
                            needs.append(at(s - 1, _F, m, rank))
                elif kind in (_B, _I):
                    needs.append(((rank, _F, s, m), False))
                    if s < last:
                        if lowered and owner(s + 1) != rank:
                            needs.append(((rank, "RECV_B", s, m), False))
                        else:
                            needs.append(at(s + 1, backward_kind.get((s + 1, m), _B), m, rank))
                elif kind == _W:
                    needs.append(((rank, _I, s, m), False))
                elif kind == "SEND_F":
                    needs.append(((rank, _F, s, m), False))
                elif kind == "SEND_B":
                    needs.append(((rank, backward_kind.get((s, m), _B), s, m), False))
                elif kind == "RECV_F":
                    needs.append(((owner(s - 1, -1), "SEND_F", s - 1, m), True))
                elif kind == "RECV_B":
                    needs.append(((owner(s + 1, -1), "SEND_B", s + 1, m), True))
                rank_needs.append(needs)  # LOAD, REDUCE_*, STEP: their place in the order is all they need
            self.needs.append(rank_needs)


_COMPUTE = frozenset({_F, _B, _I, _W})
