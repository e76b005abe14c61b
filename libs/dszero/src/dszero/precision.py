"""Training precision and loss scaling (the reference's fp16 / bf16 sections), independent of ZeRO stages."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from dsconfig import BF16Config, FP16Config

from .errors import ZeroConfigError

# fp64 is for exact tests (a parallel layout against one process, to the last bit); its masters stay fp64.
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


@attrs.frozen
class Precision:
    """What the model trains in, and how the fp16 loss is scaled.

    dtype: "fp32", "fp16" or "bf16" (the model's parameters and gradients).
    loss_scale: 0 for dynamic loss scaling (fp16), or a fixed scale.
    master_dtype: "fp32", or the model dtype where the reference allows low-precision master
    weights (bf16_master_weights_and_grads / fp16_master_weights_and_grads).
    """

    dtype: str = "fp32"
    loss_scale: float = 0.0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    consecutive_hysteresis: bool = False
    min_loss_scale: float = 1.0
    master_dtype: str = "fp32"
    optimizer_state_dtype: str = "fp32"

    def __attrs_post_init__(self) -> None:
        for name in ("dtype", "master_dtype", "optimizer_state_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ZeroConfigError(f"Precision.{name} = {getattr(self, name)!r}; valid: fp32, fp16, bf16, fp64")
        if self.dtype == "fp64":
            object.__setattr__(self, "master_dtype", "fp64")
            object.__setattr__(self, "optimizer_state_dtype", "fp64")

    @classmethod
    def from_config(cls, fp16: FP16Config | None = None, bf16: BF16Config | None = None) -> Precision:
        if fp16 is not None and fp16.enabled is True:
            return cls("fp16", fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window, fp16.hysteresis,
                       fp16.consecutive_hysteresis, fp16.min_loss_scale,
                       master_dtype="fp16" if fp16.fp16_master_weights_and_grads else "fp32")
        if bf16 is not None and bf16.enabled is True:
            return cls("bf16", master_dtype="bf16" if bf16.bf16_master_weights_and_grads else "fp32",
                       optimizer_state_dtype="bf16" if bf16.bf16_optimizer_states else "fp32")
        return cls("fp32")

    @classmethod
    def coerce(cls, value: Any) -> Precision:
        if isinstance(value, Precision):
            return value
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls(value)
        raise ZeroConfigError(f"precision must be a dszero.Precision or 'fp32' / 'fp16' / 'bf16', not {value!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def master_torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.master_dtype]

    def make_scaler(self) -> LossScaler:
        if self.dtype != "fp16":
            return LossScaler(1.0)
        if self.loss_scale:
            return LossScaler(self.loss_scale)
        return DynamicLossScaler(2.0 ** self.initial_scale_power, self.loss_scale_window, self.hysteresis,
                                 self.consecutive_hysteresis, self.min_loss_scale)


class LossScaler:
    """A fixed scale (1.0 when no scaling is needed)."""

    dynamic = False

    def __init__(self, scale: float):
        self.scale = float(scale)

    def update(self, overflow: bool) -> None:
        """Nothing to adapt."""

    @property
    def cur_scale(self) -> float:
        """DeepSpeed's name for the current scale."""
        return self.scale

    loss_scale = property(lambda self: self.scale)  # DeepSpeed's loss scalers' other name for it

    # DeepSpeed's LossScaleConfig names (optimizer.loss_scale_config), for a fixed scale.
    dynamic_loss_scale = property(lambda self: self.dynamic)
    cur_iter = 0
    scale_window = None
    min_loss_scale = None
    scale_factor = None
    last_overflow_iter = None

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])


class DynamicLossScaler(LossScaler):
    """Halve the scale on overflow (after `hysteresis` overflows); double it at the step after `window` clean ones."""

    dynamic = True

    def __init__(self, scale: float, window: int, hysteresis: int, consecutive_hysteresis: bool, min_scale: float):
        super().__init__(scale)
        self.window = window
        self.hysteresis = hysteresis
        self.consecutive_hysteresis = consecutive_hysteresis
        self.min_scale = min_scale
        self.hysteresis_left = hysteresis
        self.steps = 0
        self.last_overflow_step = -1

    # DeepSpeed's DynamicLossScaler names: steps seen, the window, the delayed shift (hysteresis)
    cur_iter = property(lambda self: self.steps)
    scale_window = property(lambda self: self.window)
    delayed_shift = property(lambda self: self.hysteresis)
    min_loss_scale = property(lambda self: self.min_scale)
    scale_factor = 2.0
    last_overflow_iter = property(lambda self: self.last_overflow_step)

    def update(self, overflow: bool) -> None:
        if overflow:
            if self.hysteresis == 1 or self.hysteresis_left <= 1:
                self.scale = max(self.scale / 2, self.min_scale)
            else:
                self.hysteresis_left -= 1
            self.last_overflow_step = self.steps
        else:
            if self.consecutive_hysteresis:
                self.hysteresis_left = self.hysteresis  # refill after any clean step
            # The reference's count: a window of clean steps must have passed before this one doubles the scale.
            stable = self.steps - self.last_overflow_step - 1
            if stable > 0 and stable % self.window == 0:
                if not self.consecutive_hysteresis:
                    self.hysteresis_left = self.hysteresis
                self.scale *= 2
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "hysteresis_left": self.hysteresis_left, "steps": self.steps,
                "last_overflow_step": self.last_overflow_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.hysteresis_left = int(state.get("hysteresis_left", self.hysteresis))
        self.steps = int(state.get("steps", 0))
        self.last_overflow_step = int(state.get("last_overflow_step", -1))
