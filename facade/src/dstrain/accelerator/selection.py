"""Which accelerator backend this process uses, chosen once (DS_ACCELERATOR, else what torch sees)."""

from __future__ import annotations

import os

from ..errors import DstrainError
from .base import Accelerator

_SUPPORTED = ("cpu", "cuda")
_current: Accelerator | None = None


def _make(name: str) -> Accelerator:
    if name == "cuda":
        from .cuda import CudaAccelerator

        return CudaAccelerator()
    from .cpu import CpuAccelerator

    return CpuAccelerator()


def get_accelerator() -> Accelerator:
    """The process's accelerator: DS_ACCELERATOR=cpu|cuda when set, else CUDA where available, else CPU."""
    global _current
    if _current is None:
        wanted = os.environ.get("DS_ACCELERATOR")
        if wanted is not None:
            if wanted not in _SUPPORTED:
                raise DstrainError(f"DS_ACCELERATOR={wanted!r}: dstrain supports {', '.join(_SUPPORTED)}")
            if wanted == "cuda":
                import torch

                if not torch.cuda.is_available():
                    raise DstrainError("DS_ACCELERATOR=cuda, but torch sees no CUDA device (a CPU-only torch, or "
                                       "no GPU here); unset it or use DS_ACCELERATOR=cpu")
            _current = _make(wanted)
        else:
            import torch

            _current = _make("cuda" if torch.cuda.is_available() else "cpu")
    return _current


def set_accelerator(accelerator: Accelerator) -> None:
    """Use `accelerator` from now on (DeepSpeed's set_accelerator)."""
    global _current
    if not isinstance(accelerator, Accelerator):
        raise TypeError(f"set_accelerator needs a dstrain accelerator, got {type(accelerator).__name__}")
    _current = accelerator


def is_current_accelerator_supported() -> bool:
    return get_accelerator().device_name() in _SUPPORTED
