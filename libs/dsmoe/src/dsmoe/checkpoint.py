"""Expert weights saved one file per (MoE layer, global expert), named as DeepSpeed names them, so a
checkpoint written at one expert-parallel size loads at another: each rank reads the files of the
experts it holds now.

    layer_{L}_expert_{E}_mp_rank_00_model_states<suffix>

L counts MoE layers in module order (DeepSpeed's moe_layer_id), or is given by the caller (`layer_ids`: a
pipeline stage holds some MoE layers only, numbered in the whole model's order), E is the global expert id. Each file
holds that expert's state-dict entries under their full names in the model (which name the global
expert: see experts.py). Reading and writing files is the caller's (the facade uses dsaio): this
module only says which entries go in which file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
from torch import nn

from .errors import MoEError
from .utils import moe_layers

EXPERT_FILE_PATTERN = re.compile(r"layer_(\d+)_expert_(\d+)_mp_rank_(\d{2})_model_states(\..+)?")


def expert_file_name(layer: int, expert: int, mp_rank: int = 0, suffix: str = "") -> str:
    """DeepSpeed's expert checkpoint name for MoE layer `layer` and global expert `expert`."""
    return f"layer_{layer}_expert_{expert}_mp_rank_{mp_rank:02d}_model_states{suffix}"


def _expert_prefix(layer_name: str, expert_id: int) -> str:
    head = f"{layer_name}." if layer_name else ""
    return f"{head}deepspeed_moe.experts.deepspeed_experts.{expert_id}."


def layer_numbers(module: nn.Module, layer_ids: Mapping[str, int] | None = None) -> list[tuple[int, str, nn.Module]]:
    """(MoE layer id, name, layer) of every MoE layer: `layer_ids[name]`, or its place in module order."""
    layers = moe_layers(module)
    if layer_ids is None:
        return [(index, name, layer) for index, (name, layer) in enumerate(layers)]
    unnumbered = [name for name, _ in layers if name not in layer_ids]
    if unnumbered:
        raise MoEError(f"MoE layer(s) {unnumbered[:3]} have no layer id (layer_ids names {sorted(layer_ids)[:3]})")
    return [(layer_ids[name], name, layer) for name, layer in layers]


def local_expert_states(module: nn.Module, suffix: str = "", layer_ids: Mapping[str, int] | None = None
                        ) -> dict[str, dict[str, torch.Tensor]]:
    """{file name: {full state-dict name: tensor}} for every expert this rank holds, in every MoE layer."""
    files = {}
    for layer_id, name, layer in layer_numbers(module, layer_ids):
        for local, expert_id in zip(layer.deepspeed_moe.experts.deepspeed_experts, layer.global_expert_ids()):
            state = local.state_dict(prefix=_expert_prefix(name, expert_id))
            files[expert_file_name(layer_id, expert_id, suffix=suffix)] = {k: v.detach() for k, v in state.items()}
    return files


def expert_state_names(module: nn.Module) -> set[str]:
    """The state-dict names of every expert this rank holds (what the per-expert files hold instead
    of the model file)."""
    return {key for state in local_expert_states(module).values() for key in state}


def expert_writers(module: nn.Module, is_writer: Callable[[nn.Module], bool],
                   layer_ids: Mapping[str, int] | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """local_expert_states of the layers whose `is_writer(layer)` is true (one rank per expert-data group)."""
    chosen = {}
    for layer_id, _, layer in layer_numbers(module, layer_ids):
        if is_writer(layer):
            for expert_id in layer.global_expert_ids():
                chosen[expert_file_name(layer_id, expert_id)] = None
    return {file: state for file, state in local_expert_states(module, layer_ids=layer_ids).items() if file in chosen}


def load_local_experts(module: nn.Module, read: Callable[[str], dict[str, torch.Tensor]], strict: bool = True,
                       layer_ids: Mapping[str, int] | None = None) -> list[str]:
    """Copy every local expert's weights from `read(file name)` (a dict of its saved entries); returns
    the names of entries the files did not hold (strict=True: an error naming them instead)."""
    missing: list[str] = []
    with torch.no_grad():
        for file, current in local_expert_states(module, layer_ids=layer_ids).items():
            saved = read(file)
            lacking = sorted(set(current) - set(saved))
            unexpected = sorted(set(saved) - set(current))
            if strict and (lacking or unexpected):
                raise MoEError(f"{file}: does not match this model's expert (missing {lacking[:4]}, unexpected "
                               f"{unexpected[:4]}); was it saved from a model with the same MoE layers?")
            for key, tensor in current.items():
                if key not in saved:
                    missing.append(key)
                    continue
                if tuple(saved[key].shape) != tuple(tensor.shape):
                    raise MoEError(f"{file}: {key} has shape {tuple(saved[key].shape)} in the checkpoint but "
                                   f"{tuple(tensor.shape)} in the model")
                tensor.copy_(saved[key])
    return missing
