"""`deepspeed.runtime.lr_schedules` as a module: the schedule classes, the names of their config keys, and
the command-line tuning flags (`add_tuning_arguments`) scripts built on DeepSpeed's examples use."""

from __future__ import annotations

import argparse
from typing import Any

from ...engine.lr_schedules import (
    WARMUP_LINEAR_RATE,
    WARMUP_LOG_RATE,
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
)

LR_SCHEDULE = "lr_schedule"
LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]

LR_RANGE_TEST_MIN_LR = "lr_range_test_min_lr"
LR_RANGE_TEST_STEP_RATE = "lr_range_test_step_rate"
LR_RANGE_TEST_STEP_SIZE = "lr_range_test_step_size"
LR_RANGE_TEST_STAIRCASE = "lr_range_test_staircase"

EDGE_VALUE = "edge_value"
MID_VALUE = "mid_value"
CYCLE_FIRST_STEP_SIZE = "cycle_first_step_size"
CYCLE_FIRST_STAIR_COUNT = "cycle_first_stair_count"
CYCLE_SECOND_STEP_SIZE = "cycle_second_step_size"
CYCLE_SECOND_STAIR_COUNT = "cycle_second_stair_count"
DECAY_STEP_SIZE = "decay_step_size"
CYCLE_MIN_LR = "cycle_min_lr"
CYCLE_MAX_LR = "cycle_max_lr"
DECAY_LR_RATE = "decay_lr_rate"
CYCLE_MIN_MOM = "cycle_min_mom"
CYCLE_MAX_MOM = "cycle_max_mom"
DECAY_MOM_RATE = "decay_mom_rate"

WARMUP_MIN_LR = "warmup_min_lr"
WARMUP_MAX_LR = "warmup_max_lr"
WARMUP_NUM_STEPS = "warmup_num_steps"
WARMUP_TYPE = "warmup_type"
WARMUP_MIN_RATIO = "warmup_min_ratio"
COS_MIN_RATIO = "cos_min_ratio"
TOTAL_NUM_STEPS = "total_num_steps"

# flag -> (type, default, help); one table for the parser and for reading the flags back.
_FLAGS: dict[str, dict[str, tuple[type, Any, str]]] = {
    LR_RANGE_TEST: {LR_RANGE_TEST_MIN_LR: (float, 0.001, "starting lr"),
                    LR_RANGE_TEST_STEP_RATE: (float, 1.0, "scaling rate of the lr"),
                    LR_RANGE_TEST_STEP_SIZE: (int, 1000, "steps between increases"),
                    LR_RANGE_TEST_STAIRCASE: (bool, False, "increase in steps, not continuously")},
    ONE_CYCLE: {CYCLE_FIRST_STEP_SIZE: (int, 1000, "steps of the rising half"),
                CYCLE_FIRST_STAIR_COUNT: (int, -1, "stairs of the rising half"),
                CYCLE_SECOND_STEP_SIZE: (int, -1, "steps of the falling half"),
                CYCLE_SECOND_STAIR_COUNT: (int, -1, "stairs of the falling half"),
                DECAY_STEP_SIZE: (int, 1000, "steps between decays after the cycle"),
                CYCLE_MIN_LR: (float, 0.01, "lowest lr of the cycle"),
                CYCLE_MAX_LR: (float, 0.1, "highest lr of the cycle"),
                DECAY_LR_RATE: (float, 0.0, "lr decay after the cycle"),
                CYCLE_MIN_MOM: (float, 0.8, "lowest momentum of the cycle"),
                CYCLE_MAX_MOM: (float, 0.9, "highest momentum of the cycle"),
                DECAY_MOM_RATE: (float, 0.0, "momentum decay after the cycle")},
    WARMUP_LR: {WARMUP_MIN_LR: (float, 0.0, "lr at the start of warmup"),
                WARMUP_MAX_LR: (float, 0.001, "lr at the end of warmup"),
                WARMUP_NUM_STEPS: (int, 1000, "warmup steps"),
                WARMUP_TYPE: (str, WARMUP_LOG_RATE, f"{WARMUP_LOG_RATE} or {WARMUP_LINEAR_RATE}")},
}


def add_tuning_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add DeepSpeed's convergence-tuning flags (--lr_schedule and each schedule's parameters)."""
    group = parser.add_argument_group("Convergence Tuning", "Convergence tuning configurations")
    group.add_argument("--lr_schedule", type=str, default=None, help=f"one of {', '.join(VALID_LR_SCHEDULES)}")
    for flags in _FLAGS.values():
        for name, (kind, default, text) in flags.items():
            if kind is bool:
                group.add_argument(f"--{name}", default=default, action="store_true", help=text)
            else:
                group.add_argument(f"--{name}", type=kind, default=default, help=text)
    return parser


def parse_arguments() -> tuple[argparse.Namespace, list[str]]:
    return add_tuning_arguments(argparse.ArgumentParser()).parse_known_args()


def get_config_from_args(args: argparse.Namespace) -> tuple[dict[str, Any] | None, str | None]:
    """The scheduler section the flags describe ({"type", "params"}), or (None, reason)."""
    schedule = getattr(args, LR_SCHEDULE, None)
    if schedule is None:
        return None, "--lr_schedule not given"
    if schedule not in VALID_LR_SCHEDULES:
        return None, f"--lr_schedule {schedule!r} is not one of {', '.join(VALID_LR_SCHEDULES)}"
    table = _FLAGS.get(WARMUP_LR if schedule in (WARMUP_DECAY_LR, WARMUP_COSINE_LR) else schedule, {})
    return {"type": schedule, "params": {name: getattr(args, name) for name in table}}, None


def get_lr_from_config(config: dict[str, Any]) -> tuple[float | None, str]:
    """The learning rate a scheduler section starts from, as DeepSpeed reads it."""
    schedule, params = config.get("type"), config.get("params", {})
    start = {LR_RANGE_TEST: LR_RANGE_TEST_MIN_LR, ONE_CYCLE: CYCLE_MAX_LR, WARMUP_LR: WARMUP_MAX_LR,
             WARMUP_DECAY_LR: WARMUP_MAX_LR, WARMUP_COSINE_LR: WARMUP_MAX_LR}.get(schedule)
    if start is None:
        return None, f"{schedule!r} is not one of {', '.join(VALID_LR_SCHEDULES)}"
    if start not in params:
        return None, f"{start} is missing from the {schedule} params"
    return params[start], ""


__all__ = ["LRRangeTest", "OneCycle", "WarmupCosineLR", "WarmupDecayLR", "WarmupLR", "add_tuning_arguments",
           "get_config_from_args", "get_lr_from_config", "parse_arguments", *[n for n in dir() if n.isupper()]]
