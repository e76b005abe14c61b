"""AutoEP weights by global expert, so a checkpoint saved at one autoep_size loads at another, and the
whole experts gathered for a 16-bit model file that loads back into the original Hugging Face class.

Per-expert files are named as dsmoe's (`layer_{L}_expert_{E}_mp_rank_00_model_states`, L counting
AutoEP layers in module order); each holds that expert's 2-D slices under the stacked weight's
full name (`model.layers.0.mlp.experts.gate_up_proj`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from ..checkpoint import expert_file_name
from ..errors import MoEError
from .apply import autoep_layers
from .layer import AutoEPLayer


def stacked_expert_weights(name: str, layer: AutoEPLayer) -> dict[str, torch.Tensor]:
    """{full name of each stacked expert weight: parameter} of one layer."""
    experts = layer.local_experts
    head = f"{name}.{layer.names.experts}." if name else f"{layer.names.experts}."
    return {head + w: getattr(experts, w) for w in experts.weight_names}


def expert_state_names(module: nn.Module) -> set[str]:
    """State-dict names of the stacked expert weights (saved per expert instead of in the model file)."""
    return {key for name, layer in autoep_layers(module) for key in stacked_expert_weights(name, layer)}


def layer_numbers(module: nn.Module, layer_ids: Mapping[str, int] | None = None) -> list[tuple[int, str, AutoEPLayer]]:
    """(layer id, name, layer) of every AutoEP layer: `layer_ids[name]` (a pipeline stage numbers its layers in
    the whole model's order), or its place in module order."""
    layers = autoep_layers(module)
    if layer_ids is None:
        return [(index, name, layer) for index, (name, layer) in enumerate(layers)]
    unnumbered = [name for name, _ in layers if name not in layer_ids]
    if unnumbered:
        raise MoEError(f"AutoEP layer(s) {unnumbered[:3]} have no layer id (layer_ids names {sorted(layer_ids)[:3]})")
    return [(layer_ids[name], name, layer) for name, layer in layers]


def global_expert_states(module: nn.Module, layer_ids: Mapping[str, int] | None = None
                         ) -> dict[str, dict[str, torch.Tensor]]:
    """{file name: {stacked weight's name: that expert's slice}} for every expert this rank holds."""
    files = {}
    for layer_id, name, layer in layer_numbers(module, layer_ids):
        stacked = stacked_expert_weights(name, layer)
        for local, expert in enumerate(layer.local_experts.global_expert_ids()):
            files[expert_file_name(layer_id, expert)] = {key: p.detach()[local] for key, p in stacked.items()}
    return files


def load_global_expert_states(module: nn.Module, read: Callable[[str], dict[str, torch.Tensor]],
                              layer_ids: Mapping[str, int] | None = None) -> None:
    """Copy each local expert's slices from `read(file name)` (saved at any autoep_size)."""
    with torch.no_grad():
        for layer_id, name, layer in layer_numbers(module, layer_ids):
            stacked = stacked_expert_weights(name, layer)
            for local, expert in enumerate(layer.local_experts.global_expert_ids()):
                file = expert_file_name(layer_id, expert)
                saved = read(file)
                for key, param in stacked.items():
                    if key not in saved:
                        raise MoEError(f"{file}: holds no {key!r} (has {sorted(saved)[:4]}); was it saved from a "
                                       f"model with the same MoE layers?")
                    if tuple(saved[key].shape) != tuple(param.shape[1:]):
                        raise MoEError(f"{file}: {key} has shape {tuple(saved[key].shape)} but one expert of the "
                                       f"model's is {tuple(param.shape[1:])}")
                    param[local].copy_(saved[key])


def full_expert_state_dict(module: nn.Module, state: dict[str, torch.Tensor] | None = None
                           ) -> dict[str, torch.Tensor]:
    """`state` (default: module.state_dict()) with every stacked expert weight gathered over its
    expert-parallel group to all [experts, ...]: the original model's names and shapes (collective
    over each layer's ep group)."""
    state = dict(module.state_dict() if state is None else state)
    for name, layer in autoep_layers(module):
        for key in stacked_expert_weights(name, layer):
            if key not in state:
                continue
            tensor = state[key].detach()
            if layer.ep_size > 1:
                pieces = [torch.empty_like(tensor) for _ in range(layer.ep_size)]
                dist.all_gather(pieces, tensor.contiguous(), group=layer.ep_group)
                tensor = torch.cat(pieces)
            state[key] = tensor
    return state
