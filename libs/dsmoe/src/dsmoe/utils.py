"""DeepSpeed's `deepspeed.moe.utils`: which parameters are experts, and optimizer parameter groups
that keep them apart.

Expert parameters carry DeepSpeed's marks (`allreduce = False`, `group_name = "ep_size_<n>"`); the
groups made here carry dscomm's tag (`"moe": True`, `"name": "ep_size_<n>"`), which is what ZeRO (through
the facade) reads to reduce them over their expert-data-parallel group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from dscomm.tags import EXPERT_GROUP_NAME_KEY, EXPERT_PARAM_GROUP_TAG

from .errors import MoEError

DEFAULT_MAX_GROUP_SIZE = 178956971  # DeepSpeed's default: elements per expert parameter group


def is_moe_param(param: torch.Tensor) -> bool:
    """Whether `param` is an expert parameter (DeepSpeed's mark: allreduce is False)."""
    return hasattr(param, "allreduce") and not param.allreduce


def is_moe_param_group(param_group: dict[str, Any]) -> bool:
    return bool(param_group.get(EXPERT_PARAM_GROUP_TAG, False))


def moe_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, layer) of every MoE layer in `module`, in module order: the order DeepSpeed numbers them.
    Each layer's gate learns its name here, so that its errors name the layer."""
    from .layer import MoE

    found = [(name, sub) for name, sub in module.named_modules() if isinstance(sub, MoE)]
    for name, layer in found:
        layer.deepspeed_moe.gate.layer_name = name or type(module).__name__
    return found


def has_moe_layers(module: nn.Module) -> tuple[bool, int]:
    """(whether `module` holds an MoE layer, the first one's num_experts), as DeepSpeed's."""
    layers = moe_layers(module)
    return (True, layers[0][1].num_experts) if layers else (False, 0)


def moe_aux_loss(module: nn.Module) -> torch.Tensor | None:
    """The sum of every MoE layer's load-balancing loss from its last forward (None before any)."""
    losses = [layer.deepspeed_moe.l_aux for _, layer in moe_layers(module) if layer.deepspeed_moe.l_aux is not None]
    return torch.stack([loss.reshape(()) for loss in losses]).sum() if losses else None


def split_params_into_shared_and_expert_params(params: Iterable[torch.nn.Parameter]
                                               ) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    shared, experts = [], []
    for param in params:
        (experts if is_moe_param(param) else shared).append(param)
    return shared, experts


def split_params_grads_into_shared_and_expert_params(group: Iterable[torch.nn.Parameter]
                                                     ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The gradients of the non-expert and of the expert parameters of `group` (those that have one)."""
    shared, experts = [], []
    for param in group:
        if param.grad is not None:
            (experts if is_moe_param(param) else shared).append(param.grad.to(param.dtype))
    return shared, experts


def split_params_into_different_moe_groups_for_optimizer(param_groups: dict | list | tuple,
                                                         max_group_size: int | float | None = DEFAULT_MAX_GROUP_SIZE
                                                         ) -> list[dict[str, Any]]:
    """DeepSpeed's: move the expert parameters of each group into groups of their own, one per expert
    group name (ep_size), with the same hyper-parameters, tagged "moe": True and named by that expert
    group; each is cut into groups of at most `max_group_size` elements (None: not cut). The groups
    given lose their expert parameters (they are modified, as DeepSpeed's are); the expert groups
    follow them in the returned list."""
    if isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif not isinstance(param_groups, list):
        raise MoEError(f"split_params_into_different_moe_groups_for_optimizer takes a parameter group (dict) or a "
                       f"list/tuple of them, got {type(param_groups).__name__}")
    for index, group in enumerate(param_groups):
        if not isinstance(group, dict) or "params" not in group:
            raise MoEError(f"split_params_into_different_moe_groups_for_optimizer: group {index} is not a dict with "
                           f"'params'")
        group["params"] = list(group["params"]) if not torch.is_tensor(group["params"]) else [group["params"]]
    # Expert group names in the order their parameters appear, so every rank builds the same groups
    # in the same order (DeepSpeed collects them in a set, whose order varies between processes).
    names: dict[str, None] = {}
    for group in param_groups:
        for param in group["params"]:
            if is_moe_param(param):
                names.setdefault(param.group_name, None)
    split: list[dict[str, Any]] = []
    for group in param_groups:
        by_name: dict[str, list[torch.nn.Parameter]] = {name: [] for name in names}
        shared = []
        for param in group["params"]:
            (by_name[param.group_name] if is_moe_param(param) else shared).append(param)
        group["params"] = shared
        for name, params in by_name.items():
            for chunk in _chunks(params, max_group_size):
                split.append({**group, EXPERT_GROUP_NAME_KEY: name, EXPERT_PARAM_GROUP_TAG: True, "params": chunk})
    param_groups.extend(split)
    return param_groups


def _chunks(params: list[torch.nn.Parameter], max_size: int | float | None) -> list[list[torch.nn.Parameter]]:
    if not params:
        return []
    if max_size is None:
        return [params]
    chunks: list[list[torch.nn.Parameter]] = [[]]
    size = 0
    for param in params:
        if chunks[-1] and size + param.numel() > max_size:
            chunks.append([])
            size = 0
        chunks[-1].append(param)
        size += param.numel()
    return chunks


def configure_moe_param_groups(model_parameters: Iterable[Any]) -> list[dict[str, Any]]:
    """What DeepSpeed's engine does to the parameters it builds an optimizer from when the model has
    MoE layers: parameters become one group named "dense-params" and are split; groups without an
    expert group are split; groups that have one are kept as they are."""
    items = list(model_parameters)
    for item in items:
        if not isinstance(item, (torch.Tensor, dict)):
            raise MoEError(f"the parameters given to the optimizer must be tensors or parameter-group dicts, got "
                           f"{type(item).__name__}")
    if not items:
        return []
    if torch.is_tensor(items[0]):
        return split_params_into_different_moe_groups_for_optimizer({"params": items, "name": "dense-params"})
    if any(is_moe_param_group(group) for group in items):
        return items
    return split_params_into_different_moe_groups_for_optimizer(items)
