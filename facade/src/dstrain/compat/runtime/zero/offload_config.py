"""`deepspeed.runtime.zero.offload_config`: the offload enums scripts compare config values against, and the
offload sections' classes (DeepSpeed defines them here; dstrain's live beside DeepSpeedZeroConfig)."""

from __future__ import annotations

from enum import StrEnum

from .config import DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig


class OffloadDeviceEnum(StrEnum):
    """Where offloaded state lives: the values of offload_param.device / offload_optimizer.device."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(StrEnum):
    """What `engine.offload_states(include=[...])` can move to the host."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"



__all__ = ["DeepSpeedZeroOffloadOptimizerConfig", "DeepSpeedZeroOffloadParamConfig", "OffloadDeviceEnum",
           "OffloadStateTypeEnum"]
