"""Mixed precision: fp16, bf16, torch.autocast, and the gradient-accumulation dtype."""

from typing import Literal

import attrs

from ..fields import Auto, section, setting

DEFAULT_LOWER_PRECISION_SAFE_MODULES = ("torch.nn.Linear", "torch.nn.Conv1d", "torch.nn.Conv2d", "torch.nn.Conv3d")


@attrs.frozen
class FP16Config:
    enabled: bool | Auto = setting(False, "Enable FP16 mixed-precision training.")
    auto_cast: bool = setting(False, "Automatically cast inputs to fp16.")
    loss_scale: float = setting(0.0, "Static loss scale; 0.0 selects dynamic loss scaling.", ge=0)
    initial_scale_power: int = setting(16, "The first dynamic loss scale is 2**initial_scale_power.", ge=0, le=128)
    loss_scale_window: int = setting(1000, "Steps without overflow before the dynamic loss scale is raised.", ge=1)
    hysteresis: int = setting(2, "Overflows tolerated before the dynamic loss scale is lowered.", ge=1)
    consecutive_hysteresis: bool = setting(False, "Refill the hysteresis on every step without overflow.")
    # The reference types this as an integer; 0.5 appears in real configs and is meaningful, so
    # any positive number is accepted.
    min_loss_scale: float = setting(1.0, "Lowest dynamic loss scale.", gt=0)
    fp16_master_weights_and_grads: bool = setting(
        False, "Keep master weights and gradients in fp16 (needs ZeRO 2/3 with offload_optimizer).")


@attrs.frozen
class BF16Config:
    enabled: bool | Auto = setting(False, "Enable bfloat16 training (no loss scaling needed).")
    bf16_master_weights_and_grads: bool = setting(
        False, "Keep ZeRO master weights and gradients in bf16 instead of fp32 (ZeRO 1-3).")
    bf16_optimizer_states: bool = setting(
        False, "Keep optimizer states in bf16 too; requires bf16_master_weights_and_grads.")
    check_grad_overflow: bool = setting(
        False, "The reference's switch for skipping bf16 steps whose gradients hold inf/nan. dstrain skips such a "
               "step either way (counted in skipped_steps): a non-finite update is never applied.")


@attrs.frozen
class TorchAutocastConfig:
    enabled: bool = setting(False, "Run the forward pass under torch.autocast.")
    dtype: Literal["bfloat16", "float16"] = setting("bfloat16", "Lower-precision dtype of torch.autocast.")
    lower_precision_safe_modules: list[str] = section(
        lambda: list(DEFAULT_LOWER_PRECISION_SAFE_MODULES),
        "Module types whose gradients/parameters are communicated in the lower precision.")


@attrs.frozen
class DataTypesConfig:
    grad_accum_dtype: Literal["fp32", "fp16", "bf16"] | None = setting(
        None, "Data type of gradient accumulation; null matches the model's type.")
    param_dtype: Literal["fp32", "fp16", "bf16"] | None = setting(
        None, "The parameters' training dtype; null follows fp16 / bf16 (fp32 without them). Given, it must "
              "name the same dtype as the enabled mode.")
    buffer_dtype: Literal["fp32", "fp16", "bf16"] | None = setting(
        None, "Cast floating-point buffers (a rotary embedding's inv_freq, normalization statistics) to this "
              "dtype; null keeps the dtype each buffer had when the model was built.")
