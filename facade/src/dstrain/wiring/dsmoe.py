"""Step 2 of compose(): Mixture-of-Experts layers (dsmoe) get their expert groups, and ZeRO reduces
expert parameters over them.

As DeepSpeed's engine does, initialize() finds the MoE layers in the model, builds the expert groups
of each layer's ep_size from the run's layout (consecutive data-parallel ranks split the experts;
the ranks at the same place in every expert group hold the same experts) and hands each layer its
groups. The optimizer's parameters become DeepSpeed's MoE parameter groups (tagged "moe", named
"ep_size_<n>"), and just before ZeRO wraps the optimizer each tagged group gets dszero's keys:
"process_group" (its expert-data-parallel group: partition and reduce it there) and
"gradient_average_over" (the data-parallel size: an expert's summed gradient is divided by every
data rank, so its scale is the same at every ep_size, as DeepSpeed divides it).

Expert parameters are named by global expert id (dsmoe.experts), so ZeRO's shards, the module file
and the per-expert files reload at another ep_size (checkpoint/experts.py). ZeRO stage 3 with MoE layers is refused by key: its units are partitioned over the
data-parallel group, and an expert lives on fewer ranks than that (DeepSpeed refuses it too).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

import dscomm
from dscomm.tags import EXPERT_GROUP_NAME_KEY
from dsconfig import DeepSpeedConfig

from ..errors import DstrainError
from .across_stages import across_stages
from .autoep import (
    apply_autoep,
    broadcast_autoep_experts,
    broadcast_experts_from_first,
    renew_optimizer_params,
)
from .optional_libs import LazyLibrary, imported

_GROUP_NAME = re.compile(r"ep_size_(\d+)")

# dsmoe is optional: a model holds MoE or AutoEP layers only once dsmoe is imported, so each step below
# is a no-op while it is not (and the gate refuses expert_parallel.enabled without dsmoe installed).
dsmoe = LazyLibrary("dsmoe", "MoE layers")
autoep = LazyLibrary("dsmoe.autoep", "AutoEP (expert_parallel.enabled)")


def apply_experts(composed: Any, config: DeepSpeedConfig, groups: Any) -> Any:
    """Give every MoE layer of composed.model its expert groups and split the optimizer's parameters
    into DeepSpeed's MoE groups (no-op without MoE layers). AutoEP (expert_parallel.enabled) swaps
    Hugging Face MoE blocks first (wiring/autoep.py)."""
    composed = apply_autoep(composed, config, groups, expert_groups)
    if not imported("dsmoe"):
        return composed
    layers = dsmoe.moe_layers(composed.model)
    # A pipeline rank holds its stage's layers only, but creating groups is collective over every rank, and a
    # refusal must reach every stage: each rank checks every stage's layers and creates every size's groups.
    described = [entry for stage in across_stages([[name, layer.ep_size, layer.num_experts] for name, layer in layers],
                                                  composed.model, groups) for entry in stage]
    if not described:
        return composed
    data = groups.size("data") if groups is not None else dscomm.groups.get_data_parallel_world_size()
    for name, ep_size, experts in described:
        dsmoe.check_expert_parallel_size(ep_size, data, experts, where=f"MoE layer {name!r}")
    for ep_size in sorted({ep_size for _, ep_size, _ in described}):  # the same order on every rank
        expert_groups(groups, ep_size)
    for _, layer in layers:
        layer.set_expert_groups(*expert_groups(groups, layer.ep_size))
    if not layers:
        return composed
    parameters = composed.model_parameters
    if parameters is None:
        parameters = composed.model.parameters()
    split = [group for group in dsmoe.configure_moe_param_groups(parameters) if group["params"]]
    return dataclasses.replace(composed, model_parameters=split)


def expert_groups(groups: Any, ep_size: int) -> tuple[Any, Any]:
    """(expert-parallel group, expert-data-parallel group) of `ep_size` in the run's layout."""
    if groups is not None and groups.dims.expert == ep_size:
        return groups.expert, groups.expert_data
    return (dscomm.groups.get_expert_parallel_group(ep_size), dscomm.groups.get_expert_data_parallel_group(ep_size))


# ------------------------------------------------------------------------------------------ ZeRO keys
def expert_param_group_keys(optimizer: Any, module: torch.nn.Module, groups: Any) -> None:
    """Before ZeRO wraps `optimizer`: its MoE groups get dszero's "process_group" and
    "gradient_average_over". A client optimizer built from plain parameters has its groups split
    first, as DeepSpeed's engine splits the parameters it builds an optimizer from."""
    if optimizer is None or not _has_experts(module):
        return
    renew_optimizer_params(optimizer, module)  # a client optimizer: AutoEP's slices for the whole experts
    param_groups = optimizer.param_groups
    if not any(dsmoe.is_moe_param_group(group) for group in param_groups):
        if optimizer.state:
            raise DstrainError("the optimizer has stepped already; initialize() must split its MoE parameters into "
                               "groups of their own before its first step")
        split = dsmoe.split_params_into_different_moe_groups_for_optimizer([dict(group) for group in param_groups])
        param_groups[:] = [group for group in split if group["params"]]
    data = groups.size("data") if groups is not None else dscomm.groups.get_data_parallel_world_size()
    placed = expert_data_groups(module)
    for index, group in enumerate(param_groups):
        experts = [p for p in group["params"] if dsmoe.is_moe_param(p)]
        if not dsmoe.is_moe_param_group(group):
            if experts:
                raise DstrainError(f"optimizer param group {index} mixes {len(experts)} expert parameter(s) with dense "
                                   f"ones; build the optimizer from dstrain.moe.utils."
                                   f"split_params_into_different_moe_groups_for_optimizer(...)")
            continue
        if len(experts) != len(group["params"]):
            raise DstrainError(f"optimizer param group {index} is tagged moe but holds {len(group['params']) - len(experts)}"
                               f" non-expert parameter(s); only expert parameters belong in it")
        ep_size = _ep_size_of(group, index)
        owners = {id(placed[id(p)]) for p in experts if id(p) in placed}
        if len(owners) > 1:
            raise DstrainError(f"optimizer param group {index} holds experts of layers placed over different "
                               f"expert-data groups; keep each layout's experts in groups of their own")
        known = placed.get(id(experts[0])) if owners else None
        group.setdefault("process_group", known if known is not None else expert_groups(groups, ep_size)[1])
        group.setdefault("gradient_average_over", data)


def expert_data_groups(module: torch.nn.Module) -> dict[int, Any]:
    """{id(expert parameter): the expert-data group its layer was placed on} (the ranks holding the same
    experts: over data ranks, or the data group when AutoEP splits the experts over the tensor group)."""
    found: dict[int, Any] = {}
    layers = [(layer.local_experts, layer.expert_data_group) for _, layer in autoep.autoep_layers(module)]
    layers += [(layer.deepspeed_moe.experts, layer.expert_data_group) for _, layer in dsmoe.moe_layers(module)]
    for experts, group in layers:
        if group is not None:
            found.update({id(p): group for p in experts.parameters()})
    return found


def _has_experts(module: torch.nn.Module) -> bool:
    return imported("dsmoe") and (bool(dsmoe.moe_layers(module)) or bool(autoep.autoep_layers(module)))


def _ep_size_of(group: dict[str, Any], index: int) -> int:
    name = str(group.get(EXPERT_GROUP_NAME_KEY, ""))
    match = _GROUP_NAME.fullmatch(name)
    if match is None:
        raise DstrainError(f"optimizer param group {index} is tagged moe but its name is {name!r}; an expert group is "
                           f"named ep_size_<n> after its expert-parallel size (split_params_into_different_moe_groups_"
                           f"for_optimizer names them)")
    return int(match.group(1))


# ------------------------------------------------------------------------------------------ weights
def is_expert_tensor(tensor: torch.Tensor) -> bool:
    return imported("dsmoe") and dsmoe.is_moe_param(tensor)


def broadcast_expert_parameters(module: torch.nn.Module) -> None:
    """Every rank starts from its expert-data-parallel group's first rank's experts (the dense
    weights come from the data-parallel group's first rank; experts differ across expert ranks)."""
    if not imported("dsmoe"):
        return
    broadcast_autoep_experts(module)
    for _, layer in dsmoe.moe_layers(module):
        broadcast_experts_from_first(layer.expert_data_group, layer.deepspeed_moe.experts.parameters())
