"""Batch arithmetic of the search: which micro-batch sizes may be tried, and the whole triple of each.

train_batch_size = micro-batch * gradient_accumulation_steps * data-parallel size, always. Which of
the three the search may move depends on what the user fixed:

- a train_batch_size given as a number is kept: only micro-batches that divide train_batch_size / dp
  are tried, accumulation making up the rest (DeepSpeed's autotuner ignores it; keeping it keeps the
  optimisation the user chose);
- otherwise autotuning.max_train_batch_size bounds it: accumulation is the largest that keeps the
  batch within the bound (as DeepSpeed does), so every experiment's batch is at most that;
- otherwise accumulation is the user's (a number, or 1) and the micro-batch alone moves.

Pure functions of plain numbers, tested without processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsconfig import ConfigError, Problem

MICRO_BATCH_CAP = 1024  # DeepSpeed's max_train_micro_batch_size_per_gpu default: the search never goes above


@dataclass(frozen=True)
class BatchLimits:
    data_parallel: int
    train_batch_size: int | None = None  # fixed by the user
    max_train_batch_size: int | None = None  # autotuning.max_train_batch_size
    gradient_accumulation_steps: int = 1  # the user's, used when neither of the above is given
    cap: int = MICRO_BATCH_CAP

    def __post_init__(self) -> None:
        problems = []
        dp = self.data_parallel
        if self.train_batch_size is not None:
            if self.train_batch_size % dp:
                problems.append(Problem("train_batch_size", f"is not divisible by the data-parallel size {dp}, so no "
                                                            f"micro-batch size fits it; give a multiple of {dp} or "
                                                            f"leave it out (\"auto\")", self.train_batch_size))
            if self.max_train_batch_size is not None and self.train_batch_size > self.max_train_batch_size:
                problems.append(Problem("autotuning.max_train_batch_size",
                                        f"is below the fixed train_batch_size ({self.train_batch_size}); raise it or "
                                        f"leave train_batch_size out", self.max_train_batch_size))
        elif self.max_train_batch_size is not None and self.max_train_batch_size < dp:
            problems.append(Problem("autotuning.max_train_batch_size",
                                    f"is below the data-parallel size {dp}: not even a micro-batch of 1 per rank "
                                    f"fits; give at least {dp}", self.max_train_batch_size))
        if problems:
            raise ConfigError(problems)

    @property
    def per_rank_budget(self) -> int | None:
        """Samples per rank per optimizer step the batch limit allows (None: no limit)."""
        if self.train_batch_size is not None:
            return self.train_batch_size // self.data_parallel
        if self.max_train_batch_size is not None:
            return self.max_train_batch_size // self.data_parallel
        return None

    def largest_micro_batch(self) -> int:
        budget = self.per_rank_budget
        return min(self.cap, budget) if budget is not None else self.cap

    def triple(self, micro_batch: int) -> tuple[int, int, int] | None:
        """(micro-batch, accumulation steps, train batch) for `micro_batch`, or None where it cannot be used."""
        if micro_batch < 1 or micro_batch > self.largest_micro_batch():
            return None
        budget = self.per_rank_budget
        if self.train_batch_size is not None:
            if budget % micro_batch:
                return None
            gas = budget // micro_batch
        elif budget is not None:
            gas = budget // micro_batch
        else:
            gas = self.gradient_accumulation_steps
        return micro_batch, gas, micro_batch * gas * self.data_parallel

    def allowed(self, low: int, high: int) -> list[int]:
        """The micro-batch sizes in [low, high] that have a triple."""
        return [m for m in range(max(low, 1), min(high, self.largest_micro_batch()) + 1) if self.triple(m)]


def tuning_micro_batches(limits: BatchLimits, low: int, high: int, count: int) -> list[int]:
    """Up to `count` micro-batch sizes to tune between the smallest and the largest that run: the largest
    and evenly spaced ones down to half of it (as DeepSpeed picks them: big micro-batches keep devices
    busy), never below `low`. Ascending."""
    if high < 1 or count < 1:
        return []
    floor = max(low, high // 2)
    allowed = limits.allowed(floor, high) or limits.allowed(low, high)
    if not allowed:
        return []
    if len(allowed) <= count:
        return allowed
    # Evenly spaced by position, the largest always included.
    picks = {allowed[round(i * (len(allowed) - 1) / (count - 1))] for i in range(count)} if count > 1 else {allowed[-1]}
    return sorted(picks)
