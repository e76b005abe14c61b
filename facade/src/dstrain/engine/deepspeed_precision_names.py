"""DeepSpeed engine's mixed-precision steps under their private names (`DeepSpeedEngine._mixed_precision_dtypes`,
`._assert_valid_mixed_precision_config`, `._cast_module_mixed_precision`), which DeepSpeed's tests and some
integrations call on the class with any object carrying `_config`, `fp16_enabled()` / `bfloat16_enabled()` or
`module`. They do what PrecisionSetup does when the engine is built: parameters in the enabled mode's dtype,
buffers left as built unless `data_types.buffer_dtype` names one."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import DstrainError
from .precision_setup import cast_module, dtype_named


class MixedPrecisionConfigError(DstrainError, AssertionError):
    """data_types.param_dtype disagrees with the enabled fp16 / bf16 mode. An AssertionError too, as DeepSpeed's."""


def _data_types_entry(config: Any, key: str) -> str | None:
    # dstrain's typed config nests them under data_types; DeepSpeed's config object has them at the top.
    data_types = getattr(config, "data_types", None)
    return getattr(data_types, key) if data_types is not None else getattr(config, key, None)


def _enabled_mode_dtype(engine: Any) -> torch.dtype | None:
    if engine.fp16_enabled():
        return torch.float16
    if engine.bfloat16_enabled():
        return torch.bfloat16
    return None


def mixed_precision_dtypes(engine: Any) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(parameter dtype: the enabled mode's, None without fp16 / bf16; buffer dtype: data_types.buffer_dtype's,
    None to keep buffers as built)."""
    return _enabled_mode_dtype(engine), dtype_named(_data_types_entry(engine._config, "buffer_dtype"))


def assert_valid_mixed_precision_config(engine: Any) -> None:
    """data_types.param_dtype, when set, must name the dtype the enabled mode trains in (fp32 without one)."""
    named = _data_types_entry(engine._config, "param_dtype")
    if named is None:
        return
    trains_in = _enabled_mode_dtype(engine) or torch.float32
    if dtype_named(named) != trains_in:
        raise MixedPrecisionConfigError(
            f"data_types.param_dtype={named!r} conflicts with the enabled precision, which trains the parameters in "
            f"{trains_in}: enable the matching fp16 / bf16 section, or leave data_types.param_dtype out")


def cast_module_mixed_precision(engine: Any, param_dtype: torch.dtype | None, buffer_dtype: torch.dtype | None,
                                is_zero_init_model: bool) -> None:
    """engine.module's parameters to `param_dtype` (not a zero.Init model's: they were built in it) and its
    buffers to `buffer_dtype`; None leaves them as they are."""
    cast_module(engine.module, None if is_zero_init_model else param_dtype, buffer_dtype, skip_partitioned=False)
