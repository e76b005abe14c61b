"""Curriculum pacing functions: the largest difficulty a sample may have at a global step.

Pure functions of the step and the schedule's numbers, as DeepSpeed's CurriculumScheduler computes
them (its golden sequences hold), with one correction: rounding down to a multiple of
`difficulty_step` never gives less than `min_difficulty` (DeepSpeed's fixed_linear with min 3 and
step 2 starts at 2, below the minimum the config asked for).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from .errors import DataEfficiencyError

SCHEDULE_TYPES = ("fixed_linear", "fixed_root", "fixed_discrete", "custom")


def fixed_root(step: int, *, min_difficulty: int, max_difficulty: int, total_curriculum_step: int,
               difficulty_step: int, root_degree: int) -> int:
    """min + (max - min) * (step / total) ** (1 / root_degree), rounded down to a multiple of
    difficulty_step, never below min_difficulty nor above max_difficulty."""
    fraction = (float(step) / total_curriculum_step) ** (1.0 / root_degree)
    value = math.floor(fraction * (max_difficulty - min_difficulty) + min_difficulty)
    value -= value % difficulty_step
    return max(min(value, max_difficulty), min_difficulty)


def fixed_linear(step: int, *, min_difficulty: int, max_difficulty: int, total_curriculum_step: int,
                 difficulty_step: int) -> int:
    """fixed_root with root_degree 1: a straight line from min to max over total_curriculum_step steps."""
    return fixed_root(step, min_difficulty=min_difficulty, max_difficulty=max_difficulty,
                      total_curriculum_step=total_curriculum_step, difficulty_step=difficulty_step, root_degree=1)


def fixed_discrete(step: int, *, difficulty: Sequence[int], max_step: Sequence[int]) -> int:
    """difficulty[i] for the steps up to max_step[i]; the last difficulty after max_step[-1]."""
    for level, last_step in zip(difficulty, max_step):
        if step <= last_step:
            return level
    return difficulty[-1]


def make_schedule(schedule_type: str, *, min_difficulty: int, max_difficulty: int, schedule_config: dict,
                  where: str = "schedule_config") -> Callable[[int], int] | None:
    """The pacing function of a schedule type as a callable of the step, after checking its numbers
    (None for "custom": the caller supplies one). Errors name `where`."""
    if schedule_type not in SCHEDULE_TYPES:
        raise DataEfficiencyError(f"schedule_type {schedule_type!r} is not one of {', '.join(SCHEDULE_TYPES)}")
    if schedule_type == "custom":
        return None
    _check_int(min_difficulty, "min_difficulty", where)
    _check_int(max_difficulty, "max_difficulty", where)
    if min_difficulty > max_difficulty:
        raise DataEfficiencyError(f"{where}: min_difficulty ({min_difficulty}) must not exceed max_difficulty "
                                  f"({max_difficulty})")
    if schedule_type == "fixed_discrete":
        difficulty, max_step = _discrete_lists(schedule_config, where)
        return lambda step: fixed_discrete(step, difficulty=difficulty, max_step=max_step)
    total = _positive(schedule_config, "total_curriculum_step", where, schedule_type)
    step_size = _positive(schedule_config, "difficulty_step", where, schedule_type)
    degree = _positive(schedule_config, "root_degree", where, schedule_type) if schedule_type == "fixed_root" else 1
    return lambda step: fixed_root(step, min_difficulty=min_difficulty, max_difficulty=max_difficulty,
                                   total_curriculum_step=total, difficulty_step=step_size, root_degree=degree)


def _check_int(value: Any, key: str, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise DataEfficiencyError(f"{where}: {key} must be an integer, got {value!r}")


def _positive(config: dict, key: str, where: str, schedule_type: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DataEfficiencyError(f"{where}.{key} must be a positive integer for schedule_type {schedule_type!r}, "
                                  f"got {value!r}")
    return value


def _discrete_lists(config: dict, where: str) -> tuple[list[int], list[int]]:
    difficulty, max_step = config.get("difficulty"), config.get("max_step")
    for key, value in (("difficulty", difficulty), ("max_step", max_step)):
        if not isinstance(value, (list, tuple)) or not value or \
                not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise DataEfficiencyError(f"{where}.{key} must be a non-empty list of integers for schedule_type "
                                      f"'fixed_discrete', got {value!r}")
    if len(difficulty) != len(max_step) + 1:
        raise DataEfficiencyError(f"{where}: fixed_discrete needs one more difficulty than max_step entries (the "
                                  f"last difficulty holds after max_step[-1]); got {len(difficulty)} difficulties "
                                  f"and {len(max_step)} steps")
    if any(b <= a for a, b in itertools.pairwise(max_step)):
        raise DataEfficiencyError(f"{where}.max_step must increase strictly, got {list(max_step)}")
    return list(difficulty), list(max_step)
