"""The classic schedules, written directly: GPipe, 1F1B (DeepSpeed's TrainSchedule order), interleaved
1F1B (Megatron / torch's ScheduleInterleaved1F1B) and forward-only inference.

Every generator takes `stages` = p, the pipeline's depth in ranks (DeepSpeed's `num_stages`), and
returns one list of compute actions per rank. Stage indices in the actions are global: with `chunks`
v, there are p*v stages and rank r holds r, r+p, ... (the "loop" placement).
"""

from __future__ import annotations

from ._checks import check_count, check_pipeline
from .action import B, F, Schedule


def gpipe(stages: int, micro_batches: int) -> Schedule:
    """All forwards, then all backwards, each in micro-batch order (torch's ScheduleGPipe)."""
    p, m = check_pipeline(stages, micro_batches)
    return [[F(r, i) for i in range(m)] + [B(r, i) for i in range(m)] for r in range(p)]


def inference(stages: int, micro_batches: int) -> Schedule:
    """Forward only, in micro-batch order (DeepSpeed's InferenceSchedule, eval_batch)."""
    p, m = check_pipeline(stages, micro_batches)
    return [[F(r, i) for i in range(m)] for r in range(p)]


def one_f_one_b(stages: int, micro_batches: int) -> Schedule:
    """1F1B (PipeDream-flush): rank r runs min(p-r-1, m) forwards, then alternates one forward and one
    backward, then drains the backwards. This is the per-rank order of DeepSpeed's TrainSchedule; it holds
    at most min(p-r, m) micro-batches' activations on rank r."""
    p, m = check_pipeline(stages, micro_batches)
    schedule = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        ops = [F(r, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [F(r, warmup + i), B(r, i)]
        ops += [B(r, i) for i in range(m - warmup, m)]
        schedule.append(ops)
    return schedule


def interleaved_1f1b(stages: int, micro_batches: int, chunks: int = 2) -> Schedule:
    """Interleaved 1F1B with `chunks` model chunks per rank (rank r holds stages r, r+p, ..., r+(v-1)p).

    Micro-batches go in rounds of about p: within a round, a rank runs every micro-batch's forward on its
    first chunk, then on its second, ...; backwards visit the chunks in reverse. Rank r warms up with
    (v-1)*round + 2*(p-1-r) forwards, then alternates forward and backward, then drains. With m a
    multiple of p this is Megatron's schedule, bubble (p-1)/(v*m); other m are split into
    max(1, m // p) rounds of near-equal size (torch's rule, without its divisibility requirement).
    """
    p, m = check_pipeline(stages, micro_batches)
    v = check_count("chunks", chunks, maximum=64)
    rounds = _rounds(m, p)
    forwards, backwards = [], []
    for start, size in rounds:
        for chunk in range(v):
            forwards.append([(chunk, start + i) for i in range(size)])
            backwards.append([(v - 1 - chunk, start + i) for i in range(size)])
    forwards = [op for group in forwards for op in group]
    backwards = [op for group in backwards for op in group]
    schedule = []
    for r in range(p):
        warmup = min((v - 1) * rounds[0][1] + 2 * (p - 1 - r), m * v)
        ops = [F(chunk * p + r, i) for chunk, i in forwards[:warmup]]
        for (f_chunk, f_mb), (b_chunk, b_mb) in zip(forwards[warmup:], backwards):
            ops += [F(f_chunk * p + r, f_mb), B(b_chunk * p + r, b_mb)]
        ops += [B(chunk * p + r, i) for chunk, i in backwards[len(forwards) - warmup:]]
        schedule.append(ops)
    return schedule


def _rounds(micro_batches: int, ranks: int) -> list[tuple[int, int]]:
    """(first micro-batch, size) of each round: max(1, m // p) rounds, the first ones one larger if uneven."""
    count = max(1, micro_batches // ranks)
    base, extra = divmod(micro_batches, count)
    rounds, start = [], 0
    for i in range(count):
        size = base + (1 if i < extra else 0)
        rounds.append((start, size))
        start += size
    return rounds
