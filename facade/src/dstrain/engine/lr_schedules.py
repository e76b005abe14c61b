"""DeepSpeed's learning-rate schedules: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest.

Each schedule is stepped once per optimizer step (`step()`), writes the lr of every param group
of the optimizer, and keeps only `last_batch_iteration` in its state dict (the format DeepSpeed
checkpoints hold). The curves are the pure functions at the top of this file; the classes only
turn them into param-group writes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

logger = logging.getLogger("dstrain.lr_schedules")

WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"
WARMUP_TYPES = (WARMUP_LOG_RATE, WARMUP_LINEAR_RATE)

__all__ = ["LRRangeTest", "OneCycle", "WarmupCosineLR", "WarmupDecayLR", "WarmupLR"]


# ----------------------------------------------------------------------------------------------
# Pure curves: plain floats in, plain floats out.


def warmup_fraction(iteration: int, warmup_num_steps: int, warmup_type: str) -> float:
    """How far through warmup step `iteration` is: log(it + 1) / log(n) or it / n."""
    if warmup_type == WARMUP_LOG_RATE:
        return math.log(iteration + 1) / math.log(warmup_num_steps)
    return iteration / warmup_num_steps


def linear_decay_fraction(iteration: int, warmup_num_steps: int, total_num_steps: int) -> float:
    """WarmupDecayLR after warmup: 1 at the end of warmup, 0 at total_num_steps, never below 0."""
    remaining = float(total_num_steps - iteration)
    return max(0.0, remaining / float(max(1.0, total_num_steps - warmup_num_steps)))


def cosine_ratio(iteration: int, warmup_num_steps: int, total_num_steps: int, cos_min_ratio: float) -> float:
    """WarmupCosineLR after warmup; progress is clamped so the ratio rests at cos_min_ratio past the end."""
    progress = (iteration - warmup_num_steps + 1) / max(1, total_num_steps - warmup_num_steps)
    progress = min(1.0, progress)
    half_cosine = (1.0 + math.cos(math.pi * progress)) / 2.0
    return max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * half_cosine)


def one_cycle_scale(iteration: int, first_step_size: float, second_step_size: float, first_stair_count: int,
                    second_stair_count: int) -> float:
    """OneCycle's position in its triangle, 0 at cycle_min and 1 at cycle_max, for `iteration` (= batch + 1)."""
    total = first_step_size + second_step_size
    rising_share = first_step_size / total
    position = iteration / total - math.floor(iteration / total)  # fraction of the current cycle
    if position <= rising_share:
        scale, stairs = position / rising_share, first_stair_count
    else:
        scale, stairs = (position - 1.0) / (rising_share - 1.0), second_stair_count
    if stairs > 0:
        # Quantise from the integer offset in the cycle, not from `scale`: at a half-cycle edge the
        # float scale can sit a hair under an exact stair and flooring it would drop a whole stair.
        offset = iteration % total
        if offset <= first_step_size:
            stair = offset * stairs / first_step_size
        else:
            stair = (total - offset) * stairs / second_step_size
        scale = math.floor(stair) / stairs
    return scale


def range_test_factor(iteration: int, step_size: int, step_rate: float, staircase: bool) -> float:
    """LRRangeTest: 1 + rate * (it + 1) / step_size, floored to whole intervals when staircase."""
    interval = (iteration + 1) / step_size
    if staircase:
        interval = math.floor(interval)
    return 1.0 + step_rate * interval


# ----------------------------------------------------------------------------------------------
# The schedules.


def _param_groups_owner(optimizer: Any) -> Any:
    """The object that holds `param_groups`: the optimizer, or the one a wrapper (ZeRO, fp16) holds."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        return inner
    if hasattr(optimizer, "param_groups"):
        return optimizer
    raise TypeError(f"{type(optimizer).__name__} is not a torch.optim.Optimizer and wraps none in .optimizer")


def _write_lrs(param_groups: list[dict], lrs: Sequence[float]) -> list:
    for group, lr in zip(param_groups, lrs):
        if torch.is_tensor(group["lr"]):  # keep a tensor lr a tensor (capturable / compiled optimizers), any shape
            group["lr"].fill_(lr.item() if torch.is_tensor(lr) else lr)
        else:
            group["lr"] = lr
    return [group["lr"] for group in param_groups]


def _per_group(optimizer: Any, value: Any, name: str) -> list:
    count = len(optimizer.param_groups)
    if isinstance(value, list | tuple):
        if len(value) != count:
            raise ValueError(f"{name}: expected {count} values (one per param group), got {len(value)}")
        return list(value)
    return [value] * count


def _checked_warmup_type(warmup_num_steps: Any, warmup_type: str) -> str:
    """The warmup curve to use. 0 and 1 steps are accepted and warm up over 2, as DeepSpeed does (real configs use 0
    for "no warmup"). An unknown curve falls back to 'log' with a warning naming it, as DeepSpeed's classes do; a
    config's scheduler.params.warmup_type is checked by dsconfig, which refuses it by key before this runs."""
    if isinstance(warmup_num_steps, bool) or not isinstance(warmup_num_steps, int) or warmup_num_steps < 0:
        raise ValueError(f"warmup_num_steps must be a non-negative integer, got {warmup_num_steps!r}")
    if warmup_type not in WARMUP_TYPES:
        logger.warning("warmup_type %r is not one of %s: warming up along the 'log' curve", warmup_type,
                       ", ".join(map(repr, WARMUP_TYPES)))
        return WARMUP_LOG_RATE
    return warmup_type


class _Schedule:
    """Shared stepping and state: subclasses define `get_lr()` for `self.last_batch_iteration`."""

    optimizer: Any
    last_batch_iteration: int

    def _start(self, last_batch_iteration: int) -> None:
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:  # a fresh start writes the first lr; a resume leaves the optimizer's
            self._apply()
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _apply(self) -> None:
        self._last_lr = _write_lrs(self.optimizer.param_groups, self.get_lr())

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def get_last_lr(self) -> list:
        """The lrs written by the last `step()` (or at construction)."""
        return self._last_lr

    def step(self, last_batch_iteration: int | None = None) -> None:
        """Advance one batch (or jump to `last_batch_iteration`) and write the new lrs."""
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = last_batch_iteration
        self._apply()

    def state_dict(self) -> dict[str, int]:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_batch_iteration = state_dict["last_batch_iteration"]


class WarmupLR(_Schedule):
    """Raise the lr from warmup_min_lr to warmup_max_lr over warmup_num_steps ('log' or 'linear'), then hold.

    warmup_max_lr defaults to each param group's own lr (as DeepSpeed does since 2026: a model whose groups
    have different learning rates keeps them).
    """

    def __init__(self, optimizer: Any, warmup_min_lr: float | list = 0.0, warmup_max_lr: float | list | None = None,
                 warmup_num_steps: int = 1000, warmup_type: str = WARMUP_LOG_RATE, last_batch_iteration: int = -1):
        warmup_type = _checked_warmup_type(warmup_num_steps, warmup_type)
        self.optimizer = _param_groups_owner(optimizer)
        if warmup_max_lr is None:
            warmup_max_lr = [group["lr"] for group in self.optimizer.param_groups]
        self.min_lrs = _per_group(self.optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(self.optimizer, warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [high - low for high, low in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)  # log(1) would divide by zero
        self.warmup_type = warmup_type
        self._start(last_batch_iteration)

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return warmup_fraction(self.last_batch_iteration, self.warmup_num_steps, self.warmup_type)
        return 1.0

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [low + delta * gamma for low, delta in zip(self.min_lrs, self.delta_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then a linear decay from warmup_max_lr to 0 at total_num_steps."""

    def __init__(self, optimizer: Any, total_num_steps: int, warmup_min_lr: float | list = 0.0,
                 warmup_max_lr: float | list = 0.001, warmup_num_steps: int = 1000,
                 warmup_type: str = WARMUP_LOG_RATE, last_batch_iteration: int = -1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)
        if total_num_steps < self.warmup_num_steps:
            logger.warning("total_num_steps %s is less than warmup_num_steps %s", total_num_steps,
                           warmup_num_steps)

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return warmup_fraction(self.last_batch_iteration, self.warmup_num_steps, self.warmup_type)
        return linear_decay_fraction(self.last_batch_iteration, self.warmup_num_steps, self.total_num_steps)


class WarmupCosineLR(_Schedule):
    """Scale each group's own lr: warmup from warmup_min_ratio to 1, then cosine down to cos_min_ratio."""

    def __init__(self, optimizer: Any, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = WARMUP_LOG_RATE,
                 last_batch_iteration: int = -1):
        warmup_type = _checked_warmup_type(warmup_num_steps, warmup_type)
        self.optimizer = _param_groups_owner(optimizer)
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type
        if total_num_steps < self.warmup_num_steps:
            logger.warning("total_num_steps %s is less than warmup_num_steps %s", total_num_steps,
                           warmup_num_steps)
        self.org_lrs = [float(group["lr"]) for group in self.optimizer.param_groups]
        self._start(last_batch_iteration)

    def get_lr_ratio(self) -> float:
        step = self.last_batch_iteration
        if step < 0:
            return 0.0
        if step < self.warmup_num_steps:
            fraction = warmup_fraction(step, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + fraction * (1.0 - self.warmup_min_ratio)
        return cosine_ratio(step, self.warmup_num_steps, self.total_num_steps, self.cos_min_ratio)

    def get_lr(self) -> list[float]:
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]


class OneCycle(_Schedule):
    """The 1Cycle policy: lr up from cycle_min_lr to cycle_max_lr and back down, then optional decay.

    With cycle_momentum, beta1 of an Adam-style optimizer moves the other way, between cycle_max_mom
    and cycle_min_mom (beta2 is set to 0.99, as DeepSpeed does); an optimizer without `betas`
    keeps its momentum (a warning says so).
    """

    def __init__(self, optimizer: Any, cycle_min_lr: float, cycle_max_lr: float, decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None,
                 decay_step_size: int = 0, cycle_momentum: bool = True, cycle_min_mom: float = 0.8,
                 cycle_max_mom: float = 0.9, decay_mom_rate: float = 0.0, last_batch_iteration: int = -1):
        self.optimizer = _param_groups_owner(optimizer)
        # The first half must have steps (the scale divides by its share of the cycle); the second may be empty.
        if isinstance(cycle_first_step_size, bool) or not isinstance(cycle_first_step_size, (int, float)) \
                or cycle_first_step_size <= 0:
            raise ValueError(f"cycle_first_step_size must be a positive number of steps, got {cycle_first_step_size!r}")
        if cycle_second_step_size is not None and (isinstance(cycle_second_step_size, bool)
                                                   or not isinstance(cycle_second_step_size, (int, float))
                                                   or cycle_second_step_size < 0):
            raise ValueError(f"cycle_second_step_size must be a number of steps >= 0 (or None: as the first), got "
                             f"{cycle_second_step_size!r}")
        self.first_step_size = float(cycle_first_step_size)
        self.second_step_size = (float(cycle_second_step_size) if cycle_second_step_size is not None
                                 else self.first_step_size)
        self.total_size = self.first_step_size + self.second_step_size
        self.step_ratio = self.first_step_size / self.total_size  # DeepSpeed's name: the rising half's share
        self.first_stair_count = cycle_first_stair_count
        self.second_stair_count = (cycle_first_stair_count if cycle_second_stair_count is None
                                   else cycle_second_stair_count)
        self.decay_step_size = decay_step_size
        no_decay_interval = math.isclose(decay_step_size, 0)

        self.min_lrs = _per_group(self.optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(self.optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = decay_lr_rate
        self.skip_lr_decay = no_decay_interval or math.isclose(decay_lr_rate, 0)

        self.cycle_momentum = cycle_momentum
        self.decay_mom_rate = decay_mom_rate
        self.skip_mom_decay = no_decay_interval or math.isclose(decay_mom_rate, 0)
        if cycle_momentum and "betas" not in self.optimizer.defaults:
            logger.warning("cycle_momentum is disabled: %s has no betas in its defaults",
                           type(self.optimizer).__name__)
            self.cycle_momentum = False
        if self.cycle_momentum:
            self.min_moms = [(mom, 0.99) for mom in _per_group(self.optimizer, cycle_min_mom, "cycle_min_mom")]
            self.max_moms = [(mom, 0.99) for mom in _per_group(self.optimizer, cycle_max_mom, "cycle_max_mom")]

        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:  # start at the bottom of the cycle (and the top of momentum)
            _write_lrs(self.optimizer.param_groups, self.min_lrs)
            if self.cycle_momentum:
                for group, betas in zip(self.optimizer.param_groups, self.min_moms):
                    group["betas"] = betas
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _scale(self) -> float:
        return one_cycle_scale(self.last_batch_iteration + 1, self.first_step_size, self.second_step_size,
                               self.first_stair_count, self.second_stair_count)

    def _decay_interval(self) -> float:
        return (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [low + (high - low) * scale for low, high in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1.0 + self.decay_lr_rate * self._decay_interval()
        return [low / factor for low in self.min_lrs]

    def get_mom(self) -> list[tuple[float, float]] | None:
        """(beta1, beta2) per group for the current batch, or None without cycle_momentum."""
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [(high[0] - (high[0] - low[0]) * scale, low[1]) for low, high in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        factor = 1.0 + self.decay_mom_rate * self._decay_interval()
        return [(beta1 * factor, beta2) for beta1, beta2 in self.max_moms]

    def step(self, batch_iteration: int | None = None) -> None:
        super().step(batch_iteration)
        if self.cycle_momentum:
            for group, betas in zip(self.optimizer.param_groups, self.get_mom()):
                group["betas"] = betas


class LRRangeTest(_Schedule):
    """Grow the lr from lr_range_test_min_lr by step_rate every step_size steps (continuous or staircase)."""

    def __init__(self, optimizer: Any, lr_range_test_min_lr: float | list = 1e-3, lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1):
        self.optimizer = _param_groups_owner(optimizer)
        if lr_range_test_step_size <= 0:
            raise ValueError(f"lr_range_test_step_size must be a positive integer, got {lr_range_test_step_size!r}")
        self.min_lr = _per_group(self.optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        self._start(last_batch_iteration)

    def get_lr(self) -> list[float]:
        factor = range_test_factor(self.last_batch_iteration, self.step_size, self.step_rate, self.staircase)
        return [lr * factor for lr in self.min_lr]
