"""DualPipeV (DeepSeek-V3's DualPipe folded onto half the ranks; github.com/deepseek-ai/DualPipe, and
DeepSpeed's DualPipeVSchedule).

V placement: rank r holds stage r (phase 0: activations flow towards rank p-1) and stage 2p-1-r
(phase 1: they flow back to rank 0, which holds the first and the loss stage). Each rank's list is
eight steps; in the main step every forward of one phase is paired with a backward of the other, which
a runtime may overlap (DualPipe overlaps their compute and communication). Some backwards are split
into I and W ("zero bubble"): W runs later, oldest first, where the rank would otherwise wait.
Needs m >= 2p micro-batches.
"""

from __future__ import annotations

from collections import deque

from ..errors import ScheduleError
from ._checks import check_pipeline
from .action import Action, Kind, Schedule


def dualpipev(stages: int, micro_batches: int) -> Schedule:
    p, m = check_pipeline(stages, micro_batches)
    if m < 2 * p:
        raise ScheduleError(f"dualpipev needs micro_batches >= 2 * stages = {2 * p}, got {m}: its main step "
                            f"pairs phase 0 with phase 1 only once both ends of the V are busy")
    return [_rank_program(r, p, m) for r in range(p)]


def _rank_program(r: int, p: int, m: int) -> list[Action]:
    program = _PhaseProgram(phase0_stage=r, phase1_stage=2 * p - 1 - r)
    f, b, w = program.forward, program.backward, program.weight
    for _ in range(2 * (p - r - 1)):  # 1: phase 0 forwards fill the V's first arm
        f(0)
    for _ in range(r + 1):  # 2: both phases' forwards
        f(0), f(1)
    for _ in range(p - r - 1):  # 3: phase 1 backwards split, their W right away, next phase 1 forward
        b(1, split=True), w(), f(1)
    for _ in range(m - 2 * p + r + 1):  # 4: main step, forward of one phase with backward of the other
        f(0), b(1), f(1), b(0)
    for _ in range(p - r - 1):  # 5: phase 0 is out of forwards
        b(1), f(1), b(0)
    half = (r + 1) // 2
    for i in range(r + 1):  # 6: both phases' backwards; the second half split into I and W
        b(1, split=i > half or (i == half and r % 2 == 1))
        b(0, split=i >= half)
    for _ in range(p - r - 1):  # 7: a deferred W, then a split phase 0 backward
        w(), b(0, split=True)
    while program.pending:  # 8: the remaining W's
        w()
    return program.ops


class _PhaseProgram:
    """One rank's list: per-phase micro-batch counters, and the I's whose W is still to run."""

    def __init__(self, phase0_stage: int, phase1_stage: int) -> None:
        self.stage = (phase0_stage, phase1_stage)
        self.forwards = [0, 0]
        self.backwards = [0, 0]
        self.pending: deque[Action] = deque()
        self.ops: list[Action] = []

    def forward(self, phase: int) -> None:
        self.ops.append(Action(Kind.F, self.stage[phase], self.forwards[phase]))
        self.forwards[phase] += 1

    def backward(self, phase: int, split: bool = False) -> None:
        stage, mb = self.stage[phase], self.backwards[phase]
        self.backwards[phase] += 1
        if split:
            self.ops.append(Action(Kind.I, stage, mb))
            self.pending.append(Action(Kind.W, stage, mb))
        else:
            self.ops.append(Action(Kind.B, stage, mb))

    def weight(self) -> None:
        self.ops.append(self.pending.popleft())
