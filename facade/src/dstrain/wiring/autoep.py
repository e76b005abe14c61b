"""AutoEP in compose() step 2: with `expert_parallel.enabled`, swap the Hugging Face MoE blocks for
dsmoe.autoep layers before the optimizer is built, on the run's expert groups.

The expert-parallel group is `autoep_size` consecutive data-parallel ranks (dscomm's expert groups,
as dsmoe layers use); the ranks holding the same experts form the expert-data group, over which ZeRO
partitions and reduces the experts (wiring/dsmoe.py: expert_param_group_keys gives their param group
"process_group" and "gradient_average_over" = the data-parallel size, so an expert's gradient has
the same scale at every autoep_size). Experts are saved one file per global expert, so a checkpoint
loads at another autoep_size, and save_16bit_model gathers them to the original model's tensors.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import dsaio
import dscomm
import dszero
from dsconfig import DeepSpeedConfig, Problem
from dszero.checkpoint import load_parameter_states, read_parameter_states
from dszero.checkpoint.by_parameter import MASTER
from dszero.checkpoint.shard_index import SHARD_PATTERN, ShardIndex

from ..errors import CheckpointLoadError, UnsupportedFeatureError
from .optional_libs import LazyLibrary, imported

EXPERT_FILE_SUFFIX = ".safetensors"

# dsmoe is optional: AutoEP layers exist only once dsmoe is imported (wiring/dsmoe.py guards its callers).
dsmoe = LazyLibrary("dsmoe", "AutoEP (expert_parallel.enabled)")
autoep = LazyLibrary("dsmoe.autoep", "AutoEP (expert_parallel.enabled)")


def apply_autoep(composed: Any, config: DeepSpeedConfig, groups: Any,
                 expert_groups: Callable[[Any, int], tuple[Any, Any]]) -> Any:
    """Swap the MoE blocks (no-op unless expert_parallel.enabled); the optimizer's parameters become
    DeepSpeed's MoE groups. `expert_groups(groups, ep_size)` -> (expert group, expert-data group)."""
    ep = config.expert_parallel
    if not ep.enabled:
        return composed
    if config.zero_optimization.stage == 3:
        raise UnsupportedFeatureError([Problem(
            "zero_optimization.stage", "AutoEP (expert_parallel.enabled) runs at ZeRO stages 0-2 here: stage 3 "
                                       "would partition the experts over the data-parallel group, which holds "
                                       "different experts on different ranks; use stage 1 or 2", 3)])
    data = groups.size("data") if groups is not None else dscomm.groups.get_data_parallel_world_size()
    if data % ep.autoep_size:
        valid = [d for d in range(1, data + 1) if data % d == 0]
        raise UnsupportedFeatureError([Problem("expert_parallel.autoep_size", f"must divide the data-parallel size "
                                                                              f"{data}; valid: {valid}", ep.autoep_size)])
    ep_group, ep_data_group = expert_groups(groups, ep.autoep_size)
    model = composed.model
    before = dict(model.named_parameters())
    autoep.apply(model, ep, ep_group if ep.autoep_size > 1 else None)
    for _, layer in autoep.autoep_layers(model):
        layer.expert_data_group = ep_data_group
    after = dict(model.named_parameters())
    swapped = {id(old): (weakref.ref(old), after[name]) for name, old in before.items()
               if name in after and after[name] is not old}
    _SWAPPED[model] = swapped
    parameters = _renewed(composed.model_parameters, swapped, model)
    split = [group for group in dsmoe.configure_moe_param_groups(parameters) if group["params"]]
    return dataclasses.replace(composed, model_parameters=split)


def _renewed(parameters: Any, swapped: dict[int, Any], model: torch.nn.Module) -> Any:
    """The user's parameters (or param groups) with each swapped expert weight replaced by the
    rank's slice that now stands under its name (default: all of the model's parameters)."""
    if parameters is None:
        return list(model.parameters())
    items = list(parameters)
    if items and isinstance(items[0], dict):
        return [{**group, "params": _renew(group["params"], swapped)} for group in items]
    return _renew(items, swapped)


def _renew(params: Any, swapped: dict[int, Any]) -> list[Any]:
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    renewed = []
    for p in params:
        old, new = swapped.get(id(p), (None, None))
        renewed.append(new if old is not None and old() is p else p)
    return renewed


def renew_optimizer_params(optimizer: Any, module: torch.nn.Module) -> None:
    """A client optimizer built before initialize() holds the experts' whole tensors: point it at
    the rank's slices now under the same names (before its first step)."""
    swapped = _SWAPPED.get(module)
    if optimizer is None or not swapped:
        return
    for group in optimizer.param_groups:
        group["params"] = _renew(group["params"], swapped)


# model -> {id(old expert weight): (weak reference to it, its slice)}; weak, so the whole experts are freed
_SWAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# ------------------------------------------------------------------------------------------ weights
def broadcast_autoep_experts(module: torch.nn.Module) -> None:
    """Every rank starts from its expert-data group's first rank's experts."""
    for _, layer in autoep.autoep_layers(module):
        broadcast_experts_from_first(layer.expert_data_group, layer.local_experts.parameters())


def broadcast_experts_from_first(group: Any, params: Any) -> None:
    """Every rank of an expert-data group takes its first rank's copy of `params` (its experts)."""
    if group is None or dist.get_world_size(group) == 1:
        return
    src = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for param in params:
            dscomm.broadcast(param.data, src, group=group, log_name="engine_broadcast_experts")


def whole_state_dict(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with the AutoEP experts gathered to the original model's [experts, ...] tensors
    (collective over each layer's expert-parallel group: every rank calls it)."""
    if not imported("dsmoe") or not autoep.autoep_layers(module):
        return state
    return autoep.full_expert_state_dict(module, state)


# ------------------------------------------------------------------------------------------ checkpoints
def autoep_state_names(module: torch.nn.Module) -> set[str]:
    return autoep.checkpoint.expert_state_names(module)


def save_autoep_experts(module: torch.nn.Module, directory: Path) -> None:
    """One file per (AutoEP layer, global expert), by the first rank of its expert-data group."""
    writes = {name for name, layer in autoep.autoep_layers(module)
              if layer.expert_data_group is None or dist.get_rank(layer.expert_data_group) == 0}
    if not writes:
        return
    for file, state in autoep.global_expert_states(module).items():
        dsaio.save_state_dict({k: v.contiguous() for k, v in state.items()}, directory / (file + EXPERT_FILE_SUFFIX))


def load_autoep_optimizer(zero: Any, module: torch.nn.Module, directory: Path, saved_dp_world_size: int,
                          dp_world_size: int, load_optimizer_states: bool) -> bool:
    """ZeRO's state for a model with AutoEP layers saved at another data-parallel size or autoep_size
    (True), else nothing done (False: ZeRO's own load). ZeRO finds shards by parameter name, and every
    expert-data group saved its slice of a stacked expert weight under the same name, so the slices are
    put back together here by expert: shard file r held data rank r's experts (expert-parallel rank
    r % saved autoep_size), each expert-data group's shards concatenated in group-rank order. The
    whole experts are then cut for this rank; the dense parameters come from ZeRO's per-parameter read."""
    if not imported("dsmoe"):
        return False
    layers = autoep.autoep_layers(module)
    if not layers:
        return False
    stacked = {name: (layer, param) for layer_name, layer in layers for name, param in
               autoep.stacked_expert_weights(layer_name, layer).items()}
    index = ShardIndex(directory)
    saved_local = {slot.name: slot.shape[0] for entry in index.entries for slot in entry.layout.slots
                   if slot.name in stacked}
    same = saved_dp_world_size == dp_world_size and all(
        saved_local.get(name) == param.shape[0] for name, (_, param) in stacked.items())
    if same:
        return False
    try:
        states, scalars = read_parameter_states(directory)  # dense parameters right; stacked experts replaced below
        whole = _whole_experts(index, stacked)
    except dszero.CheckpointError as exc:
        raise CheckpointLoadError(f"{directory}: {exc}") from None
    for name, (layer, param) in stacked.items():
        first, count = layer.local_experts.first_expert, param.shape[0]
        states[name] = {kind: tensor[first:first + count].clone() for kind, tensor in whole[name].items()}
    load_parameter_states(zero, states, scalars, load_optimizer_states=load_optimizer_states)
    return True


def _whole_experts(index: Any, stacked: dict[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
    """{stacked expert weight: {"master" / state key: all experts}} from the saved expert groups."""
    groups: dict[tuple, dict[int, Any]] = {}  # (group key, expert-parallel rank) -> {group rank: entry}
    for entry in index.entries:
        names = [slot.name for slot in entry.layout.slots]
        if not any(name in stacked for name in names):
            continue
        if not all(name in stacked for name in names):
            raise dszero.CheckpointError(f"{entry.file.name}: a parameter group mixes AutoEP experts with other "
                                         f"parameters")
        layer = stacked[names[0]][0]
        ep_size = layer.local_experts.num_global // entry.layout.slots[0].shape[0]
        saved_rank = int(SHARD_PATTERN.fullmatch(entry.file.name).group(1))
        groups.setdefault((entry.key, saved_rank % ep_size), {})[entry.group_rank] = entry
    pieces: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for (_, ep_rank), shards in groups.items():
        first = shards[min(shards)]
        if sorted(shards) != list(range(first.group_world)):
            raise dszero.CheckpointError(f"expert group of {first.layout.slots[0].name!r}, expert-parallel rank "
                                         f"{ep_rank}: shards {sorted(shards)} of {first.group_world}")
        for kind in [MASTER, *index.state_keys(first)]:
            tensor_name = kind if kind == MASTER else f"state.{kind}"
            flat = torch.cat([index.tensor(shards[r], tensor_name) for r in range(first.group_world)])
            for slot in first.layout.slots:
                pieces.setdefault(slot.name, {}).setdefault(ep_rank, {})[kind] = \
                    flat[slot.offset:slot.offset + slot.numel].view(slot.shape)
    whole = {}
    for name in stacked:
        by_rank = pieces.get(name, {})
        if not by_rank or sorted(by_rank) != list(range(len(by_rank))):
            raise dszero.CheckpointError(f"{name}: the checkpoint holds expert slices of expert-parallel ranks "
                                         f"{sorted(by_rank)}")
        kinds = set.intersection(*(set(part) for part in by_rank.values()))
        whole[name] = {kind: torch.cat([by_rank[r][kind] for r in range(len(by_rank))]) for kind in kinds}
    return whole


def expert_file_reader(directory: Path) -> Callable[[str], dict[str, torch.Tensor]]:
    """Reads one expert's file of a checkpoint directory by its name (dsmoe's and AutoEP's files alike)."""
    def read(name: str) -> dict[str, torch.Tensor]:
        path = directory / (name + EXPERT_FILE_SUFFIX)
        if not path.is_file():
            raise CheckpointLoadError(f"{path} is missing: the checkpoint holds no such expert (was it saved from a "
                                      f"model with the same MoE layers and expert counts?)")
        return dsaio.load_state_dict(path)

    return read


def load_autoep_experts(module: torch.nn.Module, directory: Path) -> None:
    if not autoep.autoep_layers(module):
        return
    try:
        autoep.load_global_expert_states(module, expert_file_reader(directory))
    except dsmoe.MoEError as exc:
        raise CheckpointLoadError(f"{directory}: {exc}") from None
