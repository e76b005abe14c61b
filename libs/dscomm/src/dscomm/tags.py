"""Marks that the parallel libraries put on parameters and parameter groups, as plain constants.

They live here, in the lowest communication layer, so ZeRO can read what the MoE, tensor- and
pipeline-parallel libraries mark without importing any of them. Pure Python: no torch.
"""

from __future__ import annotations

from typing import Any

# On a parameter *group* (a dict given to the optimizer): True for expert (MoE) parameters, which are
# replicated over the expert-data-parallel group instead of the data-parallel one.
EXPERT_PARAM_GROUP_TAG = "moe"
EXPERT_GROUP_NAME_KEY = "name"

# On a *parameter*: True when it is one tensor-parallel shard of a larger weight (dstp sets it). A
# parameter without it is replicated on every rank of the tensor group, so a global gradient norm
# counts it once, not once per tensor rank.
TENSOR_PARALLEL_ATTR = "ds_tensor_parallel"

# On a *parameter*: how many pipeline stages hold a copy of a tied weight, such as an embedding shared
# by the first and last stage (dspipe sets it); absent means 1. The norm counts it once.
PIPELINE_TIED_ATTR = "ds_pipe_tied"


def expert_group_name(ep_size: int) -> str:
    """DeepSpeed's name for the expert-parallel group of size `ep_size`."""
    return f"ep_size_{ep_size}"


def is_expert_param_group(param_group: dict[str, Any]) -> bool:
    return bool(param_group.get(EXPERT_PARAM_GROUP_TAG, False))


def is_tensor_parallel(param: Any) -> bool:
    """Whether `param` is a tensor-parallel shard (else it is replicated across the tensor group)."""
    return bool(getattr(param, TENSOR_PARALLEL_ATTR, False))


def pipeline_tied_copies(param: Any) -> int:
    """How many pipeline stages hold a copy of `param` (1 unless dspipe tied it)."""
    return int(getattr(param, PIPELINE_TIED_ATTR, 1))
