"""The unit of every schedule: an Action (what, which stage, which micro-batch) and its text form.

A compute action prints as torch.distributed.pipelining does (`2F0`: stage 2, forward, micro-batch 0;
`1B3`, `0I1`, `0W1`); communication and engine actions use the same shape (`3SEND_F1`, `0LOAD2`,
`1REDUCE_GRAD`) except the per-rank ones, which print bare (`REDUCE_TIED`, `STEP`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ..errors import ScheduleError


class Kind(enum.Enum):
    """What an action does. The value is its text form."""

    F = "F"  # forward of one stage on one micro-batch (the last stage also computes the loss)
    B = "B"  # full backward: input gradient and weight gradient together
    I = "I"  # noqa: E741  backward for the input gradient only (zero-bubble split); W follows later
    W = "W"  # backward for the weight gradient of a micro-batch whose I already ran
    SEND_F = "SEND_F"  # send stage s's output for micro-batch m to stage s+1
    RECV_F = "RECV_F"  # receive stage s's input for micro-batch m from stage s-1
    SEND_B = "SEND_B"  # send the gradient of stage s's input for micro-batch m to stage s-1
    RECV_B = "RECV_B"  # receive the gradient of stage s's output for micro-batch m from stage s+1
    LOAD = "LOAD"  # take micro-batch m from this rank's data iterator (inputs for stage 0, labels for the last)
    REDUCE_TIED = "REDUCE_TIED"  # sum the gradients of tied weights across the ranks that own a copy
    REDUCE_GRAD = "REDUCE_GRAD"  # stage s's gradients are complete: reduce them over the data-parallel group
    STEP = "STEP"  # optimizer step of this rank

    # Membership is tested on the value string: hashing an Enum member runs Python code, and these
    # properties sit in the simulator's inner loops.
    @property
    def is_compute(self) -> bool:
        return self._value_ in _COMPUTE_VALUES

    @property
    def is_backward(self) -> bool:
        return self._value_ in _BACKWARD_VALUES

    @property
    def is_send(self) -> bool:
        return self._value_ in _SEND_VALUES

    @property
    def is_recv(self) -> bool:
        return self._value_ in _RECV_VALUES

    @property
    def is_comm(self) -> bool:
        return self._value_ in _COMM_VALUES


_COMPUTE_VALUES = frozenset("FBIW")
_BACKWARD_VALUES = frozenset("BIW")
_SEND_VALUES = frozenset({"SEND_F", "SEND_B"})
_RECV_VALUES = frozenset({"RECV_F", "RECV_B"})
_COMM_VALUES = _SEND_VALUES | _RECV_VALUES
COMPUTE_KINDS = frozenset({Kind.F, Kind.B, Kind.I, Kind.W})
# The stage at the other end of a message, relative to the action's own stage.
_PEER_OFFSET = {Kind.SEND_F: 1, Kind.RECV_F: -1, Kind.SEND_B: -1, Kind.RECV_B: 1}
_MATCH = {Kind.SEND_F: Kind.RECV_F, Kind.RECV_F: Kind.SEND_F, Kind.SEND_B: Kind.RECV_B, Kind.RECV_B: Kind.SEND_B}

# Longest names first so `SEND_F` is not read as `S...`; the stage and micro-batch are plain decimals.
_KIND_PATTERN = "|".join(sorted((re.escape(k.value) for k in Kind), key=len, reverse=True))
_ACTION_RE = re.compile(rf"(?P<stage>\d{{1,6}})?(?P<kind>{_KIND_PATTERN})(?P<micro_batch>\d{{1,9}})?")


@dataclass(frozen=True, slots=True)
class Action:
    """One step of a rank's program.

    `stage` is the global (virtual) stage index, 0 .. total stages - 1; a rank may hold several.
    `micro_batch` is the micro-batch index within the batch. Rank-wide actions (REDUCE_TIED, STEP)
    have neither; REDUCE_GRAD has a stage and no micro-batch.
    """

    kind: Kind
    stage: int | None = None
    micro_batch: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, Kind):
            raise ScheduleError(f"Action kind must be a dspipe.schedules.Kind, got {self.kind!r}")
        kind = self.kind._value_
        needs_stage = kind != "STEP" and kind != "REDUCE_TIED"
        needs_micro_batch = needs_stage and kind != "REDUCE_GRAD"
        for field, value, needed in (("stage", self.stage, needs_stage),
                                     ("micro_batch", self.micro_batch, needs_micro_batch)):
            if needed and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ScheduleError(f"Action {self.kind.value}: {field} must be an int >= 0, got {value!r}")
            if not needed and value is not None:
                raise ScheduleError(f"Action {self.kind.value} takes no {field}, got {value!r}")

    @property
    def peer(self) -> int | None:
        """For a send or receive, the stage at the other end (s+1 for SEND_F/RECV_B, s-1 otherwise)."""
        offset = _PEER_OFFSET.get(self.kind)
        return None if offset is None else self.stage + offset

    def matching(self) -> Action:
        """The peer's half of this message: SEND_F(s, m) <-> RECV_F(s+1, m), SEND_B(s, m) <-> RECV_B(s-1, m)."""
        if not self.kind.is_comm:
            raise ScheduleError(f"{self} is not a send or a receive, so it has no matching action")
        return Action(_MATCH[self.kind], self.peer, self.micro_batch)

    def message_key(self) -> tuple[str, int, int]:
        """The same for a send and its receive: (direction "F" or "B", sending stage, micro-batch)."""
        if not self.kind.is_comm:
            raise ScheduleError(f"{self} is not a send or a receive, so it carries no message")
        sender = self.stage if self.kind.is_send else self.peer
        return ("F" if self.kind in (Kind.SEND_F, Kind.RECV_F) else "B", sender, self.micro_batch)

    def __str__(self) -> str:
        stage = "" if self.stage is None else str(self.stage)
        micro_batch = "" if self.micro_batch is None else str(self.micro_batch)
        return f"{stage}{self.kind.value}{micro_batch}"

    def __repr__(self) -> str:
        return str(self)

    @classmethod
    def parse(cls, text: str) -> Action:
        """The inverse of str(): `Action.parse("2F0") == Action(Kind.F, 2, 0)`."""
        if not isinstance(text, str):
            raise ScheduleError(f"an action's text must be a string like '2F0', got {type(text).__name__}")
        match = _ACTION_RE.fullmatch(text.strip())
        if match is None:
            raise ScheduleError(f"cannot read action {text[:40]!r}: expected <stage><kind><micro-batch> such as "
                                f"'2F0', '1B3', '0I1', '0W1', '3SEND_F1', '1REDUCE_GRAD' or 'STEP'; kinds: "
                                f"{', '.join(k.value for k in Kind)}")
        stage, micro_batch = match["stage"], match["micro_batch"]
        return cls(Kind(match["kind"]), None if stage is None else int(stage),
                   None if micro_batch is None else int(micro_batch))


def F(stage: int, micro_batch: int) -> Action:
    return Action(Kind.F, stage, micro_batch)


def B(stage: int, micro_batch: int) -> Action:
    return Action(Kind.B, stage, micro_batch)


def I(stage: int, micro_batch: int) -> Action:  # noqa: E743
    return Action(Kind.I, stage, micro_batch)


def W(stage: int, micro_batch: int) -> Action:
    return Action(Kind.W, stage, micro_batch)


# A schedule: one list of actions per pipeline rank, in the order that rank runs them.
Schedule = list[list[Action]]
