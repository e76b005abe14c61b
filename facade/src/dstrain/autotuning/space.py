"""The tuning space: the points an experiment can be run at, their names, and their features.

A point is a ZeRO stage, a batch triple and, unless `fast` is set, values for the stage's knobs. The
knobs tuned by default are ones dszero reads at that stage (what `ZeroOptimizer.effective_settings`
reports): the bucket size and overlap at stage 2, the prefetch bucket and persistence threshold at
stage 3, and the offload device where the user's config offloads. Stages 0 and 1 reduce one flat
buffer, so they have no knob that changes speed. The user's config narrows or widens each knob as
DeepSpeed's does: a list is the candidates, a single value fixes it, "auto" (or leaving it out) takes
the defaults; a list for a key the stage does not read is not tuned (its first value is used).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import attrs

from dsconfig import AUTO, ZeroConfig

ZERO_STAGES = (0, 1, 2, 3)

# Knobs per stage (keys under zero_optimization), with DeepSpeed's default candidates where it has them.
DEFAULT_KNOBS: dict[int, dict[str, tuple[Any, ...]]] = {
    0: {},
    1: {},
    2: {"overlap_comm": (True, False), "reduce_bucket_size": (50_000_000, 500_000_000, 1_000_000_000)},
    3: {"stage3_prefetch_bucket_size": (50_000_000, 500_000_000),
        "stage3_param_persistence_threshold": (10_000, 100_000, 1_000_000)},
}
# What dszero reads at each stage (ZeroOptimizer.effective_settings, and overlap at 2): only these change speed,
# so a user's list of candidates for any other key is not tuned (its first value is used).
STAGE_READS: dict[int, frozenset[str]] = {
    0: frozenset(), 1: frozenset(), 2: frozenset({"overlap_comm", "reduce_bucket_size"}),
    3: frozenset({"stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters",
                  "stage3_max_reuse_distance", "sub_group_size"}),
}
# Buckets of at least the model's size all hold every gradient at once: one of them stands for the rest.
BUCKET_KEYS = frozenset({"reduce_bucket_size", "stage3_prefetch_bucket_size", "allgather_bucket_size"})
OFFLOAD_SECTIONS = {"offload_optimizer": 1, "offload_param": 3}  # section -> the lowest stage it applies at

# Short names in experiment names, as DeepSpeed's z1_gas1_tmbspg3 (others use the key itself).
ABBREVIATIONS = {"overlap_comm": "oc", "reduce_bucket_size": "rbs", "allgather_bucket_size": "abs",
                 "contiguous_gradients": "cg", "reduce_scatter": "rs", "stage3_prefetch_bucket_size": "pfb",
                 "stage3_param_persistence_threshold": "ppt", "stage3_max_live_parameters": "mlp",
                 "stage3_max_reuse_distance": "mrd", "offload_optimizer.device": "oo",
                 "offload_param.device": "op"}
_SAFE_NAME = re.compile(r"[a-z0-9_.]+")
_ZERO_KEYS = frozenset(f.name for f in attrs.fields(ZeroConfig)) - {"stage"}


@dataclass(frozen=True)
class Point:
    """One experiment's tuned values. `knobs`: (key under zero_optimization, value), sorted by key."""

    stage: int
    micro_batch: int
    gas: int
    train_batch: int
    knobs: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        parts = [f"z{self.stage}", f"gas{self.gas}", f"tmbspg{self.micro_batch}"]
        parts += [f"{ABBREVIATIONS.get(key, key)}{_value_tag(value)}" for key, value in self.knobs]
        name = "_".join(parts).lower()
        if not _SAFE_NAME.fullmatch(name):  # names become file names: keep them plain
            raise ValueError(f"experiment name {name!r} has characters other than a-z, 0-9, '_' and '.'")
        return name

    @property
    def space(self) -> str:
        return f"z{self.stage}"

    def knob(self, key: str, default: Any = None) -> Any:
        return dict(self.knobs).get(key, default)


def _value_tag(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value >= 1000:
        exponent = len(str(value)) - len(str(value).rstrip("0"))
        if exponent >= 3:
            return f"{value // 10 ** exponent}e{exponent}"
    return re.sub(r"[^a-z0-9.]", "", str(value).lower()) or "x"


def parse_stages(zero_section: Any) -> tuple[tuple[int, ...], bool]:
    """(stages to tune, whether the user chose them) from zero_optimization.stage: a number, a list, or
    "all" / left out for every stage (the search then stops early when a higher stage cannot help)."""
    from dsconfig import ConfigError, Problem

    stage = zero_section.get("stage", "all") if isinstance(zero_section, Mapping) else "all"
    valid = 'a stage 0-3, a list of them such as [1, 2], or "all"'
    if stage == "all" or stage == AUTO:
        return ZERO_STAGES, False
    values = stage if isinstance(stage, list) else [stage]
    bad = [v for v in values if isinstance(v, bool) or v not in ZERO_STAGES]
    if bad or not values:
        raise ConfigError(Problem("zero_optimization.stage", f"must be {valid}", stage))
    return tuple(sorted(set(int(v) for v in values))), True


def knob_dimensions(stage: int, zero_section: Mapping[str, Any], *, fast: bool,
                    num_params: int | None = None) -> dict[str, tuple[Any, ...]]:
    """The knobs tuned at `stage` and their candidates (dotted keys under zero_optimization); none when fast."""
    if fast:
        return {}
    dims: dict[str, tuple[Any, ...]] = {}
    for key, defaults in DEFAULT_KNOBS[stage].items():
        given = zero_section.get(key, AUTO)
        if isinstance(given, list):
            dims[key] = tuple(given)
        elif given == AUTO:
            dims[key] = defaults
    for key, given in zero_section.items():  # the user's own lists widen the space where the stage reads the key
        if isinstance(given, list) and key in STAGE_READS[stage] and key not in dims:
            dims[key] = tuple(given)
    for section, lowest in OFFLOAD_SECTIONS.items():
        offload = zero_section.get(section)
        if stage < lowest or not isinstance(offload, Mapping):
            continue
        device = offload.get("device", "none")
        if isinstance(device, list):
            dims[f"{section}.device"] = tuple(device)
        elif device not in (None, "none"):
            dims[f"{section}.device"] = (device, "none")  # is the configured offload worth its cost?
    if num_params:
        for key in BUCKET_KEYS & dims.keys():
            dims[key] = collapse_buckets(dims[key], num_params)
    return {key: _unique(values) for key, values in sorted(dims.items()) if values}


def unread_lists(stage: int, zero_section: Mapping[str, Any]) -> list[str]:
    """Keys the user gave candidates for that dszero does not read at `stage` (not tuned there)."""
    return sorted(key for key, given in zero_section.items()
                  if isinstance(given, list) and key in _ZERO_KEYS and key not in STAGE_READS[stage])


def collapse_buckets(values: Sequence[Any], num_params: int) -> tuple[Any, ...]:
    """Bucket sizes below the model's size, and the smallest of those at or above it (the rest are the same)."""
    numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numeric) != len(values):
        return tuple(values)
    below = [v for v in values if v < num_params]
    whole = [v for v in values if v >= num_params]
    return tuple(below + ([min(whole)] if whole else []))


def _unique(values: Sequence[Any]) -> tuple[Any, ...]:
    seen: list[Any] = []
    for value in values:
        if not any(value == s and type(value) is type(s) for s in seen):
            seen.append(value)
    return tuple(seen)


def stage_points(stage: int, triples: Sequence[tuple[int, int, int]],
                 dims: Mapping[str, Sequence[Any]]) -> list[Point]:
    """Every combination of a batch triple and knob values, in grid order (micro-batch outermost)."""
    keys = sorted(dims)
    combos = list(itertools.product(*(dims[k] for k in keys))) if keys else [()]
    return [Point(stage, mb, gas, tb, tuple(zip(keys, combo))) for mb, gas, tb in triples for combo in combos]


def features(points: Sequence[Point]) -> list[list[float]]:
    """Each point as numbers in [0, 1] for a cost model: micro-batch and sizes on a log scale, booleans
    as 0/1, other values one-hot; columns that do not vary are left out."""
    columns: list[list[float]] = []
    raw_columns: dict[str, list[Any]] = {"stage": [p.stage for p in points],
                                         "micro_batch": [p.micro_batch for p in points],
                                         "gas": [p.gas for p in points]}
    keys = sorted({k for p in points for k, _ in p.knobs})
    for key in keys:
        raw_columns[key] = [p.knob(key) for p in points]
    for values in raw_columns.values():
        columns += _encode(values)
    return [list(row) for row in zip(*columns)] if columns else [[] for _ in points]


def _encode(values: list[Any]) -> list[list[float]]:
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric:
        scaled = [math.log(v) if all(x > 0 for x in values) else float(v) for v in values]
        low, high = min(scaled), max(scaled)
        return [[(v - low) / (high - low) for v in scaled]] if high > low else []
    distinct = _unique(values)
    if len(distinct) < 2:
        return []
    if all(isinstance(v, bool) for v in values):
        return [[1.0 if v else 0.0 for v in values]]
    return [[1.0 if v == d and type(v) is type(d) else 0.0 for v in values] for d in distinct]
