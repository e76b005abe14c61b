"""Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward is
split into I (the input gradient, which the previous stage waits for) and W (the weight gradient, which
only the optimizer step needs), and W passes are moved into what would be bubbles.

- zb_h1 (the paper's handcrafted ZB-H1): 1F1B's order with B split into I and W, rank r running each W
  r micro-batches after its I. Rank r holds min(p-r, m) activations awaiting I, as 1F1B does, plus at
  most r awaiting W. Bubble (p-1)/(3m) at F = I = W and m >= p, a third of 1F1B's; for m < p the
  makespan is 2m + 2p - 1 (the dependency chain of the last micro-batch).
- zbv (the paper's ZB-V, Section 6): the V placement, rank r holding stage r (chunk 0) and stage
  2p-1-r (chunk 1), each half a 1F1B stage. Bubble (p-1)/(6m) at F = I = W and m >= 2p-1 (half of
  ZB-H1's, and ZB-H1's at smaller m), at most 2p chunk activations per rank: 1F1B's first rank.
"""

from __future__ import annotations

from ._checks import check_pipeline
from .action import Action, F, I, Kind, Schedule, W


def zb_h1(stages: int, micro_batches: int) -> Schedule:
    """ZB-H1: per rank, 1F1B's forwards and input-gradient backwards, each W `rank` I's late."""
    p, m = check_pipeline(stages, micro_batches)
    schedule = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [F(r, i) for i in range(warmup)]
        for i in range(m):
            if warmup + i < m:
                ops.append(F(r, warmup + i))
            ops.append(I(r, i))
            if i >= r:  # the W that is `r` behind; the last r W's drain at the end
                ops.append(W(r, i - r))
        ops += [W(r, i) for i in range(max(0, m - r), m)]
        schedule.append(ops)
    return schedule


def zbv(stages: int, micro_batches: int) -> Schedule:
    """ZB-V on the V placement: warm up chunk 0 deeply, then alternate (F, I, W) on chunk 0 and chunk 1,
    then drain the I's with the W's filling in behind them.

    Built for n = max(m, 2p-1) micro-batches (the fewest that fill the V) and cut back to m: removing
    the actions of micro-batches that do not exist keeps every remaining dependency in order."""
    p, m = check_pipeline(stages, micro_batches)
    n = max(m, 2 * p - 1)
    schedule = []
    for r in range(p):
        program = _ChunkProgram(chunk0=r, chunk1=2 * p - 1 - r)
        program.run("F0" * (2 * (p - r) - 1))
        program.run("F1F0" * r)
        program.run("F1I1W1" * (p - r))
        while program.forwards[1] < program.forwards[0] or program.forwards[0] < n:
            if program.forwards[0] < n:
                program.run("F0")
            program.run("I0W0F1I1W1")
        program.run("I0I1" * r)
        program.run("I0W0" * (p - r))
        program.drain_weights(1)
        program.drain_weights(0)
        schedule.append([a for a in program.ops if a.micro_batch < m])
    return schedule


class _ChunkProgram:
    """One rank's list for two chunks, written as "F0I1W1..." (kind letter, chunk); each chunk's F, I and
    W take the micro-batches in order."""

    def __init__(self, chunk0: int, chunk1: int) -> None:
        self.stage = (chunk0, chunk1)
        self.forwards = [0, 0]
        self.counts = {Kind.F: self.forwards, Kind.I: [0, 0], Kind.W: [0, 0]}
        self.ops: list[Action] = []

    def run(self, text: str) -> None:
        for letter, chunk in zip(text[::2], map(int, text[1::2])):
            kind = Kind(letter)
            counter = self.counts[kind]
            self.ops.append(Action(kind, self.stage[chunk], counter[chunk]))
            counter[chunk] += 1

    def drain_weights(self, chunk: int) -> None:
        while self.counts[Kind.W][chunk] < self.counts[Kind.I][chunk]:
            self.run(f"W{chunk}")
