"""validate(schedule): every dependency, every message, and that the program finishes.

Checks, each fault reported with its rank and step on the rank-by-step grid:
- each stage lives on one rank (the placement's, when one is given); stages and micro-batches are
  numbered 0..n-1 without gaps; no action appears twice;
- every (stage, micro-batch) has exactly one F and, when the schedule trains, exactly one B or one I
  and one W;
- on a rank: B/I(s,m) after F(s,m); W(s,m) after I(s,m); for neighbour stages on the same rank,
  F(s+1,m) after F(s,m) and B/I(s,m) after B/I(s+1,m);
- lowered programs (any action other than F/B/I/W): each cut between neighbour stages on different
  ranks has SEND_F after the F and RECV_F before the next stage's F (and SEND_B/RECV_B likewise for the
  backward), every send meets exactly one receive on the peer's rank and every receive one send, no
  message between stages of one rank, LOAD before the first and last stage's F, and when training
  REDUCE_GRAD of each stage after its backwards, REDUCE_TIED, and one STEP last;
- the program finishes: it is run with every action taking no time (sends never block, receives do,
  as lower.py defines), and a DeadlockError shows where each rank is stuck.
"""

from __future__ import annotations

from ..errors import ScheduleError
from .action import Action, Kind, Schedule
from .grid import render_grid
from .placement import Placement
from .simulate import execute

MAX_LISTED = 20
_COMPUTE = frozenset("FBIW")
_RANK_WIDE = frozenset({"REDUCE_TIED", "STEP"})
Key = tuple[str, int | None, int | None]  # (kind letter(s), stage, micro-batch)


def validate(schedule: Schedule, placement: Placement | None = None) -> None:
    """Raise ScheduleError (DeadlockError if it cannot finish) describing every fault; return None if sound."""
    _check_types(schedule)
    check = _Check(schedule)
    if placement is not None:
        check.placement(placement)
    if check.numbered:
        check.counts()
        check.order()
        if check.lowered and check.owned:
            check.program()
    check.raise_if_faulty()
    # Run it with every action taking no time: raises DeadlockError, with the grid, if a rank never goes on.
    execute(schedule, [[0.0] * len(actions) for actions in schedule], comm=0.0)


def _check_types(schedule: Schedule) -> None:
    if not isinstance(schedule, list | tuple) or not schedule:
        raise ScheduleError(f"a schedule is a non-empty list with one list of actions per rank, got {schedule!r:.60}")
    for rank, actions in enumerate(schedule):
        if not isinstance(actions, list | tuple):
            raise ScheduleError(f"rank {rank}: expected a list of actions, got {type(actions).__name__}")
        for step, action in enumerate(actions):
            if not isinstance(action, Action):
                raise ScheduleError(f"rank {rank} step {step}: {action!r:.40} is not a dspipe.schedules.Action")


def _text(key: Key) -> str:
    kind, stage, mb = key
    return f"{'' if stage is None else stage}{kind}{'' if mb is None else mb}"


class _Check:
    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.marks: dict[tuple[int, int], str] = {}
        self.notes: list[str] = []
        self.where: dict[Key, tuple[int, int]] = {}  # every stage-bearing action -> (rank, step)
        self.rank_of: dict[int, int] = {}
        self.lowered = False
        stages: set[int] = set()
        micro_batches: set[int] = set()
        self.training = False
        self.owned = True  # every stage on one rank
        for rank, actions in enumerate(schedule):
            rank_wide: set[str] = set()
            for step, action in enumerate(actions):
                kind = action.kind._value_
                if kind in _RANK_WIDE:
                    if kind in rank_wide:
                        self.at(rank, step, f"{action} runs twice on rank {rank}")
                    rank_wide.add(kind)
                    self.lowered = True
                    continue
                key = (kind, action.stage, action.micro_batch)
                if key in self.where:
                    r, s = self.where[key]
                    self.at(rank, step, f"{action} runs twice (first at rank {r} step {s})")
                    continue
                self.where[key] = (rank, step)
                first = self.rank_of.setdefault(action.stage, rank)
                if first != rank:
                    self.at(rank, step, f"stage {action.stage} is on rank {first}, but {action} runs on rank {rank}")
                    self.owned = False
                if kind in _COMPUTE:
                    stages.add(action.stage)
                    micro_batches.add(action.micro_batch)
                    self.training |= kind != "F"
                else:
                    self.lowered = True
        self.stages, self.micro_batches = max(stages, default=-1) + 1, max(micro_batches, default=-1) + 1
        self.numbered = bool(stages) and len(stages) == self.stages  # later checks index stages 0..n-1
        if not stages:
            self.notes.append("the schedule has no compute action (F, B, I, W)")
        elif len(stages) != self.stages:
            self.notes.append(f"stages {sorted(set(range(self.stages)) - stages)} have no compute action; stages "
                              f"must be numbered 0..n-1")
        if stages and len(micro_batches) != self.micro_batches:
            self.notes.append(f"micro-batches {sorted(set(range(self.micro_batches)) - micro_batches)} have no "
                              f"compute action; micro-batches must be numbered 0..n-1")

    @property
    def faulty(self) -> bool:
        return bool(self.marks or self.notes)

    def at(self, rank: int, step: int, reason: str) -> None:
        self.marks.setdefault((rank, step), reason)

    def mark_near(self, candidates: list[Key], reason: str) -> None:
        found = next((self.where[key] for key in candidates if key in self.where), None)
        if found is None:
            self.notes.append(reason)
        else:
            self.at(*found, reason)

    def raise_if_faulty(self) -> None:
        if not self.faulty:
            return
        notes = self.notes[:MAX_LISTED] + ([f"... and {len(self.notes) - MAX_LISTED} more"]
                                           if len(self.notes) > MAX_LISTED else [])
        marks = dict(sorted(self.marks.items())[:MAX_LISTED])
        text = "\n".join([f"invalid pipeline schedule: {len(self.marks) + len(self.notes)} fault(s)", *notes,
                          render_grid(self.schedule, marks)])
        if len(self.marks) > MAX_LISTED:
            text += f"\n... and {len(self.marks) - MAX_LISTED} more marked faults"
        raise ScheduleError(text)

    def placement(self, placement: Placement) -> None:
        if len(self.schedule) != placement.ranks:
            self.owned = False
            self.notes.append(f"the schedule has {len(self.schedule)} rank lists, the placement {placement.ranks} ranks")
            return
        for (_, stage, _), (rank, step) in self.where.items():
            if stage >= placement.stages:
                self.owned = False
                self.at(rank, step, f"stage {stage} does not exist (0..{placement.stages - 1})")
            elif placement.rank_of[stage] != rank:
                self.owned = False
                self.at(rank, step, f"stage {stage} belongs on rank {placement.rank_of[stage]} "
                                    f"({placement.shape} placement)")

    def backward_of(self, stage: int, mb: int) -> Key | None:
        for kind in ("B", "I"):
            if (kind, stage, mb) in self.where:
                return (kind, stage, mb)
        return None

    def counts(self) -> None:
        where = self.where
        for (_, stage, mb), (rank, step) in where.items():
            if stage >= self.stages or (mb is not None and mb >= self.micro_batches):
                self.at(rank, step, f"stage {stage} or micro-batch {mb} has no compute action at all")
        for s in range(self.stages):
            for m in range(self.micro_batches):
                # A missing action has no cell: the fault is marked on its nearest relative that exists.
                if ("F", s, m) not in where:
                    self.mark_near([("B", s, m), ("I", s, m), ("F", s - 1, m)],
                                   f"{s}F{m} is missing: every micro-batch needs a forward on every stage")
                if not self.training:
                    continue
                b, i, w = (("B", s, m) in where), (("I", s, m) in where), (("W", s, m) in where)
                if b and (i or w):
                    self.at(*where[("B", s, m)], f"stage {s} micro-batch {m} has both B and a split I/W backward")
                elif not b and not (i and w):
                    lacking = "I and W" if not (i or w) else ("W" if i else "I")
                    self.mark_near([("I", s, m), ("W", s, m), ("F", s, m)],
                                   f"stage {s} micro-batch {m} has no complete backward: B, or I and W "
                                   f"(missing {lacking})")

    def order(self) -> None:
        """Dependencies between actions of one rank must follow the rank's order."""
        where = self.where
        for (kind, s, m), (rank, step) in where.items():
            if kind in ("B", "I"):
                needs = [("F", s, m), self.backward_of(s + 1, m)]
            elif kind == "W":
                needs = [("I", s, m)]
            elif kind == "F" and s > 0:
                needs = [("F", s - 1, m)]
            else:
                continue
            for need in needs:
                found = where.get(need) if need else None
                if found and found[0] == rank and found[1] > step:
                    self.at(rank, step, f"{_text((kind, s, m))} runs before {_text(need)} (step {found[1]}), "
                                        f"which it needs")

    def program(self) -> None:
        where, rank_of, last = self.where, self.rank_of, self.stages - 1
        for s in range(last):
            if rank_of[s] == rank_of[s + 1]:
                continue
            cut = f"stages {s} and {s + 1} are on ranks {rank_of[s]} and {rank_of[s + 1]}"
            for m in range(self.micro_batches):
                self.expect(("SEND_F", s, m), rank_of[s], after=("F", s, m), why=cut)
                self.expect(("RECV_F", s + 1, m), rank_of[s + 1], before=("F", s + 1, m), why=cut)
                if self.training:
                    self.expect(("RECV_B", s, m), rank_of[s], before=self.backward_of(s, m), why=cut)
                    self.expect(("SEND_B", s + 1, m), rank_of[s + 1], after=self.backward_of(s + 1, m), why=cut)
        loaded: dict[tuple[int, int], int] = {}
        for (kind, s, m), (rank, step) in where.items():
            if kind in ("SEND_F", "SEND_B", "RECV_F", "RECV_B"):
                peer = s + (1 if kind in ("SEND_F", "RECV_B") else -1)
                match = {"SEND_F": "RECV_F", "RECV_F": "SEND_F", "SEND_B": "RECV_B", "RECV_B": "SEND_B"}[kind]
                if not 0 <= peer <= last:
                    self.at(rank, step, f"{_text((kind, s, m))} talks to stage {peer}, which does not exist (0..{last})")
                elif rank_of[peer] == rank:
                    self.at(rank, step, f"{_text((kind, s, m))}: stages {s} and {peer} are both on rank {rank}; they "
                                        f"share tensors in memory, not messages")
                elif (match, peer, m) not in where:
                    self.at(rank, step, f"{_text((kind, s, m))} has no matching {_text((match, peer, m))} on rank "
                                        f"{rank_of[peer]}")
            elif kind == "LOAD":
                if (rank, m) in loaded:
                    self.at(rank, step, f"micro-batch {m} is loaded twice on rank {rank}")
                loaded[(rank, m)] = step
        for rank in {rank_of[0], rank_of[last]}:
            for m in range(self.micro_batches):
                forwards = [where[("F", s, m)][1] for s in {0, last} if rank_of[s] == rank and ("F", s, m) in where]
                if (rank, m) not in loaded:
                    self.notes.append(f"rank {rank} holds stage 0 or {last} but never loads micro-batch {m} (LOAD)")
                elif forwards and loaded[(rank, m)] > min(forwards):
                    self.at(rank, loaded[(rank, m)], f"micro-batch {m} is loaded after its first forward on rank {rank}")
        if self.training:
            for rank, actions in enumerate(self.schedule):
                self.step(rank, actions)

    def expect(self, key: Key, rank: int, before: Key | None = None, after: Key | None = None, why: str = "") -> None:
        where = self.where
        if key not in where:
            self.mark_near([k for k in (before, after) if k], f"{_text(key)} is missing on rank {rank} ({why})")
            return
        at_rank, at_step = where[key]
        if before is not None and before in where and where[before][1] < at_step:
            self.at(at_rank, at_step, f"{_text(key)} comes after {_text(before)}, which needs it ({why})")
        if after is not None and after in where and where[after][1] > at_step:
            self.at(at_rank, at_step, f"{_text(key)} comes before {_text(after)}, which produces it ({why})")

    def step(self, rank: int, actions: list[Action]) -> None:
        kinds = [a.kind for a in actions]
        if kinds.count(Kind.STEP) != 1 or kinds[-1] is not Kind.STEP:
            self.notes.append(f"rank {rank} must end with exactly one STEP (found {kinds.count(Kind.STEP)}, last "
                              f"action {actions[-1] if actions else None})")
        if Kind.REDUCE_TIED not in kinds:
            self.notes.append(f"rank {rank} has no REDUCE_TIED before its STEP")
        last_backward: dict[int, int] = {}
        for i, a in enumerate(actions):
            if a.kind in (Kind.B, Kind.W):
                last_backward[a.stage] = i
        for stage, i in last_backward.items():
            reduced = self.where.get(("REDUCE_GRAD", stage, None))
            if reduced is None:
                self.notes.append(f"rank {rank} never reduces the gradients of stage {stage} (REDUCE_GRAD)")
            elif reduced[1] < i:
                self.at(rank, reduced[1], f"gradients of stage {stage} reduced before its last backward (step {i})")
