"""`deepspeed.runtime.zero.config`: DeepSpeed's ZeRO config classes over dsconfig's `zero_optimization` section.

    DeepSpeedZeroConfig(stage=3, stage3_prefetch_bucket_size=12345).prefetch_bucket_size   # 12345
    DeepSpeedZeroConfig(cpu_offload=True).offload_optimizer                                # an offload config

The keywords are the section's keys, read by dsconfig exactly as in a whole config (`dsconfig.load_section`):
old names migrated (`cpu_offload`, `cpu_offload_param`, `stage3_gather_fp16_weights_on_model_save`, ...), types
and bounds checked, keys dstrain does not implement refused with dsconfig's message. Attributes answer under
DeepSpeed's field names (`prefetch_bucket_size`, `param_persistence_threshold`, `max_live_parameters`,
`max_reuse_distance`, `gather_16bit_weights_on_model_save`, `module_granularity_threshold`) as under the config
keys, and `overlap_comm` defaults to True at stage 3 as DeepSpeed's validator sets it. `.config` is the
dsconfig section itself.
"""

from __future__ import annotations

import warnings
from enum import IntEnum
from typing import Any, ClassVar

import attrs

import dsconfig


class ZeroStageEnum(IntEnum):
    """DeepSpeed's names of the ZeRO stages."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


# DeepSpeed's field name -> dsconfig's key (the key DeepSpeed's configs spell, its pydantic alias).
FIELD_NAMES = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "module_granularity_threshold": "stage3_module_granularity_threshold",
}


class _Section:
    """Attribute access to a dsconfig section under DeepSpeed's names; read-only, as dsconfig's are frozen."""

    _section: ClassVar[str] = ""
    _names: ClassVar[dict[str, str]] = {}

    def __init__(self, **fields: Any):
        with warnings.catch_warnings():  # old key names are DeepSpeed's own spellings here, accepted quietly
            warnings.simplefilter("ignore", dsconfig.ConfigWarning)
            config = dsconfig.load_section(self._section, self._prepare(fields))
        object.__setattr__(self, "config", config)

    def _prepare(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {self._names.get(key, key): value for key, value in fields.items()}

    def __getattr__(self, name: str) -> Any:
        config = self.__dict__.get("config")
        key = self._names.get(name, name)
        if config is not None and key in attrs.fields_dict(type(config)):
            return getattr(config, key)
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only (dsconfig's sections are frozen): cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.config == self.config  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


class DeepSpeedZeroOffloadParamConfig(_Section):
    """`zero_optimization.offload_param` on its own (dsconfig's OffloadParamConfig)."""

    def __init__(self, **fields: Any):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dsconfig.ConfigWarning)
            zero = dsconfig.load_section("zero_optimization", {"offload_param": fields})
        object.__setattr__(self, "config", zero.offload_param)

    @classmethod
    def of(cls, config: Any) -> DeepSpeedZeroOffloadParamConfig | None:
        if config is None:
            return None
        made = cls.__new__(cls)
        object.__setattr__(made, "config", config)
        return made


class DeepSpeedZeroOffloadOptimizerConfig(DeepSpeedZeroOffloadParamConfig):
    """`zero_optimization.offload_optimizer` on its own; `pipeline` is pipeline_read or pipeline_write."""

    def __init__(self, **fields: Any):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dsconfig.ConfigWarning)
            zero = dsconfig.load_section("zero_optimization", {"offload_optimizer": fields})
        object.__setattr__(self, "config", zero.offload_optimizer)

    @property
    def pipeline(self) -> bool:
        return bool(self.config.pipeline_read or self.config.pipeline_write)


class DeepSpeedZeroConfig(_Section):
    """DeepSpeed's `DeepSpeedZeroConfig(**zero_optimization)`, read by dsconfig."""

    _section = "zero_optimization"
    _names = FIELD_NAMES

    def _prepare(self, fields: dict[str, Any]) -> dict[str, Any]:
        prepared = super()._prepare(fields)
        if "overlap_comm" not in prepared and prepared.get("stage") == ZeroStageEnum.weights:
            prepared["overlap_comm"] = True  # DeepSpeed's default at stage 3 (False below it)
        return prepared

    @property
    def offload_param(self) -> DeepSpeedZeroOffloadParamConfig | None:
        return DeepSpeedZeroOffloadParamConfig.of(self.config.offload_param)

    @property
    def offload_optimizer(self) -> DeepSpeedZeroOffloadOptimizerConfig | None:
        return DeepSpeedZeroOffloadOptimizerConfig.of(self.config.offload_optimizer)

    @property
    def pipeline_loading_checkpoint(self) -> bool:
        """dstrain has no pipelined checkpoint loading: always False (dsconfig refuses the key set to true)."""
        return False


__all__ = ["DeepSpeedZeroConfig", "DeepSpeedZeroOffloadOptimizerConfig", "DeepSpeedZeroOffloadParamConfig",
           "ZeroStageEnum"]
