"""`deepspeed.runtime.utils` names scripts use: `set_random_seed`, `see_memory_usage` (dsmonitor), `PartitionedTensor`
(dscomm), `move_to_device`, `call_to_str`, `count_used_parameters_in_backward`, the gradient helpers of
grad_norms.py (`clip_grad_norm_`, `CheckOverflow`, ...), and the pipeline partitioners where dspipe is installed."""

from __future__ import annotations

import random
from typing import Any

import torch

from dscomm import PartitionedTensor
from dsmonitor import see_memory_usage

from .grad_norms import (
    CheckOverflow,
    clip_grad_norm_,
    get_global_norm,
    get_weight_norm,
    is_model_parallel_parameter,
)


def set_random_seed(seed: int) -> None:
    """Seed Python's, numpy's (where installed) and torch's generators (every device), as DeepSpeed does."""
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed)
    torch.manual_seed(seed)


def move_to_device(item, device, criterion_func=None):
    """`item` (a tensor, or lists, tuples and dicts of them, nested) on `device`, containers rebuilt.

    With `criterion_func`, a tensor it accepts is moved in place (its `.data` replaced, so references to it
    see the move) and everything else is returned as it is; without it every tensor is copied to `device`.
    """
    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    if criterion_func is not None:
        if criterion_func(item):
            item.data = item.data.to(device)
        return item
    return item.to(device) if hasattr(item, "to") else item


def call_to_str(base: str, *args: Any, **kwargs: Any) -> str:
    """`base(arg, ..., key=value, ...)` with each value's repr: how DeepSpeed names a call in its logs."""
    shown = [repr(arg) for arg in args] + [f"{key}={value!r}" for key, value in kwargs.items()]
    return f"{base}({', '.join(shown)})"


def count_used_parameters_in_backward(parameters: Any) -> int:
    """How many of `parameters` the running backward pass will produce gradients for (their gradient
    accumulators are part of its graph), counting a shared accumulator once. Only inside a backward pass (a hook)."""
    if torch._C._current_graph_task_id() == -1:
        raise RuntimeError("count_used_parameters_in_backward must be called during a backward pass (from a "
                           "gradient hook)")
    from torch.autograd.graph import _get_grad_fn_or_grad_acc

    nodes = set()
    for param in parameters:
        if torch.is_tensor(param) and param.requires_grad:
            with torch.enable_grad():  # hooks run with grad mode off; leaves' accumulators need it on
                node = _get_grad_fn_or_grad_acc(param)
            if node is not None:
                nodes.add(node)
    return sum(1 for node in nodes if torch._C._will_engine_execute_node(node))


def __getattr__(name: str):
    if name in ("partition_uniform", "partition_balanced", "prefix_sum_inc"):
        from ...wiring.optional_libs import require

        return getattr(require("dspipe", f"deepspeed.runtime.utils.{name}"), name)
    raise AttributeError(f"module 'dstrain.runtime.utils' has no attribute {name!r}")


__all__ = ["CheckOverflow", "PartitionedTensor", "call_to_str", "clip_grad_norm_", "count_used_parameters_in_backward",
           "get_global_norm", "get_weight_norm", "is_model_parallel_parameter", "move_to_device", "see_memory_usage",
           "set_random_seed"]
