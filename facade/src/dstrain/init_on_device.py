"""`OnDevice`: DeepSpeed's context for building a model's tensors on a device (the "meta" device: shapes without
memory, to be materialised later) and in a floating dtype, without touching the model's code.

    with dstrain.OnDevice(dtype=torch.half, device="meta"):
        model = MyModel()          # every parameter: dtype half, on the meta device

Inside, floating tensors created without an explicit dtype take `dtype`, and tensors created without an explicit
device land on `device` (torch's own device context). Both are restored on exit, also after an exception.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import DstrainError


class OnDevice:
    """Create tensors on `device` with floating dtype `dtype` inside the block (`enabled=False`: do nothing)."""

    def __init__(self, dtype: torch.dtype, device: str | torch.device = "meta", enabled: bool = True):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise DstrainError(f"OnDevice(dtype={dtype!r}): dtype must be a floating torch dtype (torch.half, "
                               f"torch.bfloat16, torch.float32, ...)")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise DstrainError(f"OnDevice(device={device!r}): not a torch device ({exc})") from None
        self.dtype, self.enabled = dtype, enabled
        self._saved: list[Any] = []

    def __enter__(self) -> OnDevice:
        if self.enabled:
            context = torch.device(self.device)
            context.__enter__()
            self._saved.append((context, torch.get_default_dtype()))
            torch.set_default_dtype(self.dtype)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.enabled and self._saved:
            context, dtype = self._saved.pop()
            torch.set_default_dtype(dtype)
            context.__exit__(*exc_info)


__all__ = ["OnDevice"]
