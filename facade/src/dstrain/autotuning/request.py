"""What a user's config asks the autotuner for, read once from its raw JSON (lists of candidates and
"auto" are allowed where the search fills them in; everything else is checked by dsconfig per point)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dsconfig
from dsconfig import AUTO, AutotuningConfig, ConfigError, Problem

from . import ranking
from .batches import BatchLimits
from .script_args import check_arg_mappings, mapped_value
from .space import parse_stages
from .tuners import TUNERS

TB, MB, GAS = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"


@dataclass(frozen=True)
class TuningRequest:
    raw: dict  # the user's config as written
    settings: AutotuningConfig
    metric: str
    stages: tuple[int, ...]
    stages_chosen: bool  # the user listed the stages (all of them are tuned, no early stop across stages)
    micro_batches: tuple[int, ...] | None  # the user's list: exactly these are tried
    min_micro_batch: int
    limits: BatchLimits
    zero_section: dict
    arg_mappings: dict[str, str]

    @property
    def data_parallel(self) -> int:
        return self.limits.data_parallel


def read_settings(raw: Mapping[str, Any]) -> AutotuningConfig:
    """The autotuning section, checked by dsconfig (its errors name autotuning.<key>)."""
    section = raw.get("autotuning")
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise ConfigError(Problem("autotuning", "must be an object", section))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DeepSpeed's older keys (start_step, num_gpus) warn in the runs
        cfg = dsconfig.load({TB: 1, "autotuning": dict(section)}, world_size=1, strict=False)
    return cfg.autotuning


def data_parallel_size(raw: Mapping[str, Any], world_size: int, mp_size: int) -> int:
    """The world over the config's tensor/pipeline degrees, or over autotuning.mp_size for a script that
    brings its own model parallelism."""
    from ..wiring.layout import data_parallel_size as layout_dp
    from ..wiring.layout import requested_degrees

    dp = layout_dp(requested_degrees(dict(raw)), world_size)
    if dp == world_size and mp_size > 1:
        if world_size % mp_size:
            raise ConfigError(Problem("autotuning.mp_size", f"does not divide the {world_size} processes of the job",
                                      mp_size))
        dp = world_size // mp_size
    return dp


def read_request(raw: Mapping[str, Any], *, world_size: int, script_args: Sequence[str] = ()) -> TuningRequest:
    settings = read_settings(raw)
    mappings = check_arg_mappings(settings.arg_mappings)
    problems: list[Problem] = []
    zero = raw.get("zero_optimization") or {}
    if not isinstance(zero, Mapping):
        raise ConfigError(Problem("zero_optimization", "must be an object", zero))
    stages, chosen = parse_stages(zero)
    if settings.tuner_type not in TUNERS:
        problems.append(Problem("autotuning.tuner_type", f"must be one of {', '.join(TUNERS)}", settings.tuner_type))

    def number(key: str, value: Any) -> int | None:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        problems.append(Problem(key, "must be a positive integer, \"auto\", or left out", value))
        return None

    def from_script(key: str) -> int | None:
        flag = mappings.get(key)
        text = mapped_value(script_args, flag) if flag else None
        return int(text) if text is not None and text.isdigit() and int(text) >= 1 else None

    micro, micro_list = raw.get(MB, AUTO), None
    if isinstance(micro, list):
        bad = [m for m in micro if isinstance(m, bool) or not isinstance(m, int) or m < 1]
        if bad or not micro:
            problems.append(Problem(MB, "a list of micro-batch sizes to try must hold positive integers", micro))
        else:
            micro_list = tuple(sorted(set(micro)))
        min_micro = min(micro_list) if micro_list else 1
    elif micro == AUTO:
        min_micro = from_script(MB) or 1
    else:
        min_micro = number(MB, micro) or 1
    gas_raw = raw.get(GAS, AUTO)
    gas = (from_script(GAS) or 1) if gas_raw == AUTO else number(GAS, gas_raw) or 1
    tb_raw = raw.get(TB, AUTO)
    fixed_batch = None if tb_raw == AUTO else number(TB, tb_raw)
    if problems:
        raise ConfigError(problems)
    dp = data_parallel_size(raw, world_size, settings.mp_size)
    limits = BatchLimits(dp, fixed_batch, settings.max_train_batch_size, gas)
    return TuningRequest(raw=dict(raw), settings=settings, metric=ranking.check_metric(settings.metric), stages=stages,
                         stages_chosen=chosen, micro_batches=micro_list, min_micro_batch=min_micro, limits=limits,
                         zero_section=dict(zero), arg_mappings=mappings)
