"""Argument checks shared by the generators; every message names the argument and what is valid."""

from __future__ import annotations

from ..errors import ScheduleError

MAX_STAGES = 4096
MAX_MICRO_BATCHES = 1 << 20


def check_count(name: str, value: object, *, minimum: int = 1, maximum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise ScheduleError(f"{name} must be an int in {minimum}..{maximum}, got {value!r}")
    return value


def check_pipeline(stages: object, micro_batches: object) -> tuple[int, int]:
    """(stages, micro_batches) as ints; `stages` is the pipeline's depth in ranks."""
    return (check_count("stages", stages, maximum=MAX_STAGES),
            check_count("micro_batches", micro_batches, maximum=MAX_MICRO_BATCHES))
