"""`deepspeed.runtime.precision_config`: the `bf16` and `fp16` sections of a config dict, read by dsconfig as in
a whole config (`bfloat16`, DeepSpeed's older name of `bf16`, included)."""

from __future__ import annotations

import warnings
from typing import Any

import dsconfig
from dsconfig import BF16Config as DeepSpeedBF16Config
from dsconfig import FP16Config as DeepSpeedFP16Config


def _section(param_dict: dict, name: str, old_name: str | None = None) -> Any:
    if not isinstance(param_dict, dict):
        raise dsconfig.ConfigError(dsconfig.Problem("<config>", "must be a dict", param_dict))
    raw = {key: value for key, value in param_dict.items() if key in (name, old_name)}
    with warnings.catch_warnings():  # DeepSpeed's older spelling is read quietly here, as DeepSpeed reads it
        warnings.simplefilter("ignore", dsconfig.ConfigWarning)
        loaded = dsconfig.load({**raw, "train_batch_size": 1}, strict=False)
    return getattr(loaded, name)


def get_bfloat16_config(param_dict: dict) -> DeepSpeedBF16Config:
    """The config's `bf16` (or `bfloat16`) section, defaults filled in."""
    return _section(param_dict, "bf16", "bfloat16")


def get_float16_config(param_dict: dict) -> DeepSpeedFP16Config:
    """The config's `fp16` section, defaults filled in."""
    return _section(param_dict, "fp16")


__all__ = ["DeepSpeedBF16Config", "DeepSpeedFP16Config", "get_bfloat16_config", "get_float16_config"]
