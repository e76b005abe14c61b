"""`deepspeed.runtime.utils` names scripts use: `set_random_seed`, `see_memory_usage` (dsmonitor), and the
pipeline partitioners where dspipe is installed."""

from __future__ import annotations

import random

import torch

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


def __getattr__(name: str):
    if name in ("partition_uniform", "partition_balanced", "prefix_sum_inc"):
        from ...wiring.optional_libs import require

        return getattr(require("dspipe", f"deepspeed.runtime.utils.{name}"), name)
    raise AttributeError(f"module 'dstrain.runtime.utils' has no attribute {name!r}")


__all__ = ["see_memory_usage", "set_random_seed"]
