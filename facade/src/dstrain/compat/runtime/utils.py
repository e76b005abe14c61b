"""`deepspeed.runtime.utils` names scripts use: `set_random_seed`, `see_memory_usage` (dsmonitor), `PartitionedTensor`
(dscomm),
`move_to_device`, `is_model_parallel_parameter`, and the pipeline partitioners where dspipe is installed."""

from __future__ import annotations

import random

import torch

import dscomm
from dscomm import PartitionedTensor
from dsmonitor import see_memory_usage


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


def is_model_parallel_parameter(param) -> bool:
    """Whether `param` is one shard of a weight split over the tensor (model) parallel ranks: cut by AutoTP
    (dscomm.is_tensor_parallel), or marked so by Megatron (`tensor_model_parallel` / `model_parallel`)."""
    return dscomm.is_tensor_parallel(param) or any(
        bool(getattr(param, attr, False)) for attr in ("tensor_model_parallel", "model_parallel"))


def __getattr__(name: str):
    if name in ("partition_uniform", "partition_balanced", "prefix_sum_inc"):
        from ...wiring.optional_libs import require

        return getattr(require("dspipe", f"deepspeed.runtime.utils.{name}"), name)
    raise AttributeError(f"module 'dstrain.runtime.utils' has no attribute {name!r}")


__all__ = ["PartitionedTensor", "is_model_parallel_parameter", "move_to_device", "see_memory_usage", "set_random_seed"]
