"""DeepSpeed's `deepspeed.runtime.zero.partition_parameters`, the module code written for DeepSpeed reaches into:
`Init`, `GatheredParameters`, `ZeroParamStatus`, and the tensor-constructor overrides `Init` applies.

While an `Init` with a dtype (given, or the config's fp16 / bf16: float32 otherwise) is active, torch's
constructors (`torch.tensor`, `empty`, `zeros`, `ones`, `full`, `arange`, `eye`, `randn`) make floating-point
tensors in that dtype, as DeepSpeed's do. `Init` builds each wrapper with
`zero_wrapper_for_fp_tensor_constructor(_orig_torch_<name>, target_fp_dtype=..., target_device=...)`, looked up
in this module when the context is entered, so a caller may replace it for the length of an `Init` (Hugging
Face Transformers does, to keep `torch.arange`'s dtype for rotary embeddings).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .init import Init, _contradicting_single_rank_pg_error  # noqa: F401  (DeepSpeed reaches it here)
from .status import ZeroParamStatus
from .units import GatheredParameters

# torch's own constructors, kept under DeepSpeed's names: the wrappers call these, and callers compare with them.
_orig_torch_tensor = torch.tensor
_orig_torch_empty = torch.empty
_orig_torch_zeros = torch.zeros
_orig_torch_ones = torch.ones
_orig_torch_full = torch.full
_orig_torch_arange = torch.arange
_orig_torch_eye = torch.eye
_orig_torch_randn = torch.randn

# The shape a partitioned parameter shows while released (`param.ds_shape` is its whole shape): empty.
partitioned_param_data_shape = [0]


class MultipleAllGatherHandles:
    """Several gathers in flight, waited for as one. `wait(handle_dependency=...)` hands the flag on by keyword
    to each handle whose `wait` takes it (DeepSpeed's own handles); others (torch.distributed's `Work`) are
    waited for plainly."""

    def __init__(self, handles: Iterable[Any]):
        self.handles = list(handles)

    def wait(self, handle_dependency: bool = True) -> None:
        for handle in self.handles:
            if _takes_keyword(handle.wait, "handle_dependency"):
                handle.wait(handle_dependency=handle_dependency)
            else:
                handle.wait()


def _takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature (pybind11's Work.wait)
        return False
    return any((p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) or p.kind is p.VAR_KEYWORD
               for p in parameters)


CONSTRUCTORS = ("tensor", "empty", "zeros", "ones", "full", "arange", "eye", "randn")


def zero_wrapper_for_fp_tensor_constructor(fn: Callable[..., torch.Tensor], target_fp_dtype: torch.dtype | None,
                                           target_device: torch.device | None = None) -> Callable[..., torch.Tensor]:
    """`fn` making its tensors on `target_device` (where the call names no device) and its floating-point ones
    in `target_fp_dtype`."""

    def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device") is None and target_device is not None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        if target_fp_dtype is not None and tensor.is_floating_point() and tensor.dtype != target_fp_dtype:
            tensor.data = tensor.data.to(target_fp_dtype)
        return tensor

    return wrapped


def override_constructors(dtype: torch.dtype | None, device: torch.device | None) -> Callable[[], None]:
    """Replace torch's constructors by wrapped ones; returns the function that puts back what was there."""
    module = globals()
    before = {name: getattr(torch, name) for name in CONSTRUCTORS}
    wrap = module["zero_wrapper_for_fp_tensor_constructor"]  # read now: a caller may have replaced it
    for name in CONSTRUCTORS:
        setattr(torch, name, wrap(module[f"_orig_torch_{name}"], target_fp_dtype=dtype, target_device=device))

    def restore() -> None:
        for name, original in before.items():
            setattr(torch, name, original)

    return restore


__all__ = ["CONSTRUCTORS", "GatheredParameters", "Init", "MultipleAllGatherHandles", "ZeroParamStatus",
           "override_constructors", "partitioned_param_data_shape", "zero_wrapper_for_fp_tensor_constructor"]
