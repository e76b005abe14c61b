"""Which implementation of the fused ops serves a tensor: Triton on a GPU where triton is installed, torch
everywhere else. DSTRAIN_KERNELS=torch|triton|auto overrides (read at each call, so a test can set it)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from types import ModuleType

import torch

from ...errors import DstrainError

ENV = "DSTRAIN_KERNELS"
_CHOICES = ("auto", "torch", "triton")
INSTALL_HINT = "pip install 'dstrain[kernels]' (or pip install triton)"


@functools.cache  # asked on every fused op; a package search each time would cost more than the op
def triton_available() -> bool:
    """Whether the triton package is installed (it is the `kernels` extra)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Whether Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1), so CPU tensors can use them."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def backend_name(tensor: torch.Tensor) -> str:
    """'triton' or 'torch': the implementation that computes the fused ops on `tensor`."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise DstrainError(f"{ENV}={choice!r} is not a kernel choice; valid: {', '.join(_CHOICES)}")
    if tensor.dtype == torch.float64:
        return "torch"  # the kernels compute in float32; double precision stays exact on the torch path
    runs_here = tensor.is_cuda or triton_interpreted()
    if choice == "torch" or (choice == "auto" and not (tensor.is_cuda and triton_available())):
        return "torch"
    if not triton_available():
        raise DstrainError(f"{ENV}=triton but triton is not installed: {INSTALL_HINT}")
    if not runs_here:
        raise DstrainError(f"{ENV}=triton needs a CUDA tensor (this one is on {tensor.device}) or the CPU "
                           "interpreter (TRITON_INTERPRET=1)")
    return "triton"


def ops_for(tensor: torch.Tensor) -> ModuleType:
    """The module (torch_ops or triton_ops) whose functions compute the fused ops on `tensor`."""
    name = "torch_ops" if backend_name(tensor) == "torch" else "triton_ops"
    return importlib.import_module(f"{__package__}.{name}")
