"""The config's precision sections turned into what the engine does: the model's dtype, dszero's
`Precision`, input casting for fp16.auto_cast, and the torch.autocast context."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from dsconfig import DeepSpeedConfig
from dszero import Precision

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_named(name: str | None) -> torch.dtype | None:
    """The torch dtype of a config's dtype name ("fp16", "bf16", "fp32", or torch's own spellings)."""
    if name is None:
        return None
    dtype = _DTYPES.get(name) or getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}; valid: {sorted(_DTYPES)} or torch's names (float16, ...)")
    return dtype


def cast_module(module: torch.nn.Module, param_dtype: torch.dtype | None, buffer_dtype: torch.dtype | None,
                skip_partitioned: bool = True) -> None:
    """Floating parameters to `param_dtype` and floating buffers to `buffer_dtype` in place (None: left as
    built); parameters keep their identity. Partitioned ones (zero.Init: `ds_shape`) are dszero's to cast."""
    if param_dtype is not None:
        for param in module.parameters():
            if (param.is_floating_point() and param.dtype != param_dtype
                    and not (skip_partitioned and hasattr(param, "ds_shape"))):
                param.data = param.data.to(param_dtype)
    if buffer_dtype is not None:
        for buffer in module.buffers():
            if buffer.is_floating_point() and buffer.dtype != buffer_dtype:
                buffer.data = buffer.data.to(buffer_dtype)


class PrecisionSetup:
    def __init__(self, cfg: DeepSpeedConfig, device: torch.device):
        self.precision = Precision.from_config(cfg.fp16, cfg.bf16)
        self.model_dtype = _DTYPES[self.precision.dtype]
        self.auto_cast = bool(cfg.fp16.enabled is True and cfg.fp16.auto_cast)
        self.autocast_enabled = cfg.torch_autocast.enabled
        self.autocast_dtype = _AUTOCAST_DTYPES[cfg.torch_autocast.dtype]
        self.device = device
        grad_dtype = cfg.data_types.grad_accum_dtype
        self.grad_accum_dtype = _DTYPES[grad_dtype] if grad_dtype else None
        comm = cfg.communication_data_type
        self.communication_dtype = _DTYPES[comm] if comm else None
        buffers = cfg.data_types.buffer_dtype
        self.buffer_dtype = _DTYPES[buffers] if buffers else None

    @property
    def fp16(self) -> bool:
        return self.precision.dtype == "fp16"

    @property
    def bf16(self) -> bool:
        return self.precision.dtype == "bf16"

    def prepare_module(self, module: torch.nn.Module) -> None:
        """The model's parameters in their training dtype (fp16 / bf16 cast in place, parameters keep their
        identity); floating-point buffers keep the dtype they were built in (an fp32 rotary inv_freq stays fp32,
        as DeepSpeed's engine leaves them) unless data_types.buffer_dtype names one. A float64 model without
        fp16 / bf16 trains in float64 (dszero's "fp64", masters included), as DDP would."""
        if self.model_dtype == torch.float32 and {
                p.dtype for p in module.parameters() if p.is_floating_point()} == {torch.float64}:
            self.precision, self.model_dtype = Precision("fp64"), torch.float64
        cast_module(module, self.model_dtype if self.model_dtype != torch.float32 else None, self.buffer_dtype)

    def cast_inputs(self, value: Any) -> Any:
        """fp16.auto_cast: floating-point inputs become fp16, nested in lists, tuples and dicts."""
        if not self.auto_cast:
            return value
        if torch.is_tensor(value):
            return value.half() if value.is_floating_point() else value
        if isinstance(value, (list, tuple)):
            return type(value)(self.cast_inputs(v) for v in value)
        if isinstance(value, dict):
            return {k: self.cast_inputs(v) for k, v in value.items()}
        return value

    def forward_context(self):
        if not self.autocast_enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
