"""From the user's config (with its lists and "auto"s) to the concrete config of one point: the
experiment's (monitors off, the autotuning section kept so the engine knows its profile steps) and the
optimal one written at the end (the autotuning section removed, as DeepSpeed writes it)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any

from dsconfig import ConfigError, Problem

from .space import OFFLOAD_SECTIONS, Point

MONITORS = ("tensorboard", "csv_monitor", "wandb", "comet")


def concrete_config(raw: Mapping[str, Any], point: Point) -> dict:
    """`raw` with the point's stage, batch triple and knobs; every other list of candidates becomes its
    first value (DeepSpeed's fast mode does the same) and sections the stage cannot use are dropped."""
    cfg = copy.deepcopy(dict(raw))
    zero = dict(cfg.get("zero_optimization") or {})
    zero["stage"] = point.stage
    for key, value in list(zero.items()):
        if isinstance(value, list) and value:
            zero[key] = value[0]
    for section in OFFLOAD_SECTIONS:
        if isinstance(zero.get(section), Mapping):
            zero[section] = dict(zero[section])
            device = zero[section].get("device")
            if isinstance(device, list) and device:
                zero[section]["device"] = device[0]
    for key, value in point.knobs:
        head, _, tail = key.partition(".")
        if tail:
            zero[head] = {**(zero.get(head) or {}), tail: value}
        else:
            zero[key] = value
    for section, lowest in OFFLOAD_SECTIONS.items():
        if point.stage < lowest:
            zero.pop(section, None)  # dsconfig refuses offload a stage cannot do
    cfg["zero_optimization"] = zero
    cfg["train_micro_batch_size_per_gpu"] = point.micro_batch
    cfg["gradient_accumulation_steps"] = point.gas
    cfg["train_batch_size"] = point.train_batch
    return cfg


def experiment_config(raw: Mapping[str, Any], point: Point) -> dict:
    cfg = concrete_config(raw, point)
    for monitor in MONITORS:  # short runs would only scatter the user's logs
        if isinstance(cfg.get(monitor), Mapping):
            cfg[monitor] = {**cfg[monitor], "enabled": False}
    cfg["autotuning"] = {**(cfg.get("autotuning") or {}), "enabled": True}
    return cfg


def optimal_config(raw: Mapping[str, Any], point: Point) -> dict:
    cfg = concrete_config(raw, point)
    cfg.pop("autotuning", None)
    return cfg


def config_problems(cfg: Mapping[str, Any], data_parallel: int) -> list[Problem]:
    """What initialize() would refuse in `cfg` at `data_parallel` ranks (none: it loads)."""
    from ..wiring.config_source import load_config
    from ..wiring.feature_gate import check_features

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unknown keys warn once, in the training run itself
            loaded, raw = load_config(dict(cfg), data_parallel)
        check_features(loaded, raw)
    except ConfigError as exc:
        return list(exc.problems)
    return []


def get_path(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node
