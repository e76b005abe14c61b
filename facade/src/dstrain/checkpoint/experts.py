"""Experts as a layout: dsmoe's MoE layers and AutoEP's, saved one file per (layer, global expert) with
DeepSpeed's names (`layer_{L}_expert_{E}_mp_rank_00_model_states.safetensors`), so a checkpoint saved at
one expert-parallel size loads at another.

- dsmoe names each expert's parameters by its global id (`...deepspeed_experts.<E>.`): every rank's
  module, ZeRO shards and files use the whole model's names, so loading at another ep_size reads by name.
- AutoEP stacks a rank's experts in one tensor per weight (`...mlp.experts.gate_up_proj`, [local experts,
  ...]) whose name every expert-parallel rank shares: its files hold one expert's slice each, the whole
  tensor is the experts stacked in id order, and this rank's piece is rows [first, first + count)
  (`StackedExperts.cut`). ZeRO saved each expert-data group's slice under the same name, so its state is
  put back together by expert here (`whole_stacked_states`). Beside AutoTP, AutoEP may split the experts
  over the tensor ranks instead of data ranks (recorded as "over": "tensor"): then each tensor rank's
  directory holds its slice, and the slices are stacked in tensor-rank order (`SavedLayout.merge`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import dsaio
import dszero
from dszero.checkpoint.shard_index import SHARD_PATTERN, ShardIndex

from ..errors import CheckpointLoadError
from ..wiring.optional_libs import LazyLibrary, imported
from .contents import MASTER
from .files import parse_expert_file

# dsmoe is optional: a model holds MoE or AutoEP layers only once dsmoe is imported.
dsmoe = LazyLibrary("dsmoe", "MoE layers")
autoep = LazyLibrary("dsmoe.autoep", "AutoEP (expert_parallel.enabled)")


def autoep_layers(module: torch.nn.Module) -> list:
    return autoep.autoep_layers(module) if imported("dsmoe") else []


def moe_layers(module: torch.nn.Module) -> list:
    return dsmoe.moe_layers(module) if imported("dsmoe") else []


# ---------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class StackedExperts:
    """This run's AutoEP weights: {stacked name: (first expert held here, how many, experts in all, ep_size)}."""

    ranges: dict[str, tuple[int, int, int, int]]
    over_tensor: frozenset[str] = frozenset()  # weights whose experts are split over the tensor ranks

    @classmethod
    def of(cls, module: torch.nn.Module) -> StackedExperts:
        ranges, over_tensor = {}, set()
        for layer_name, layer in autoep_layers(module):
            local = layer.local_experts
            for name in autoep.stacked_expert_weights(layer_name, layer):  # (at stage 3 the tensors are released)
                ranges[name] = (local.first_expert, local.num_local, local.num_global, layer.ep_size)
                if layer.replicated_tokens and layer.ep_size > 1:
                    over_tensor.add(name)
        return cls(ranges, frozenset(over_tensor))

    def describe(self) -> dict[str, dict[str, Any]]:
        """What a checkpoint records to read these weights back without the model."""
        return {name: {"experts": total, "ep_size": ep, **({"over": "tensor"} if name in self.over_tensor else {})}
                for name, (_, _, total, ep) in self.ranges.items()}

    def cut(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """This rank's experts of a whole stacked weight (any other tensor as it is)."""
        if name not in self.ranges:
            return whole
        first, count, total, _ = self.ranges[name]
        if whole.shape[0] != total:
            raise CheckpointLoadError(f"{name}: the checkpoint holds {whole.shape[0]} experts, the model {total}")
        return whole[first:first + count]


def saved_stacked(description: Any, where: Path) -> dict[str, dict[str, int]]:
    """A checkpoint's record of its AutoEP weights, checked (the file is read from disk and may be crafted)."""
    if description is None:
        return {}
    ok = isinstance(description, dict) and all(
        isinstance(name, str) and isinstance(entry, dict)
        and all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) and entry[k] >= 1
                for k in ("experts", "ep_size"))
        and entry["experts"] % entry["ep_size"] == 0 and entry.get("over", "data") in ("data", "tensor")
        for name, entry in description.items())
    if not ok:
        raise CheckpointLoadError(f"{where}: the layout's 'autoep' entry is malformed (expected {{weight name: "
                                  f"{{'experts': n, 'ep_size': d}}}} with d dividing n, and 'over' data or tensor)")
    return description


# ---------------------------------------------------------------------------------------------- module files
def expert_state_names(module: torch.nn.Module) -> set[str]:
    """State-dict names the per-expert files hold (left out of the module file)."""
    names = dsmoe.checkpoint.expert_state_names(module) if moe_layers(module) else set()
    if autoep_layers(module):
        names |= autoep.checkpoint.expert_state_names(module)
    return names


def save_expert_files(module: torch.nn.Module, directory: Path, record: Callable[[int, int], dict[str, str]], *,
                      layer_ids: Any = None, tensor_rank: int | None = None) -> None:
    """Each expert's weights into its own file, by the first rank of its expert-data group; `record(moe layer,
    expert)` is the file's metadata. `layer_ids` (layout.MoELayerIds): a pipeline stage's MoE layers numbered
    in the whole model's order. `tensor_rank`: files shared by every tensor rank (a pipeline's, at the top),
    so experts that every tensor rank holds alike are written by tensor rank 0 only."""
    def writes(layer: Any) -> bool:
        alike = not getattr(layer, "replicated_tokens", False) or layer.ep_size == 1  # not split over tensor ranks
        return _first_of(layer.expert_data_group) and (tensor_rank in (None, 0) or not alike)

    files: dict[str, dict[str, torch.Tensor]] = {}
    if autoep_layers(module) and any(writes(layer) for _, layer in autoep_layers(module)):
        states = autoep.global_expert_states(module, layer_ids=layer_ids.autoep if layer_ids else None)
        files.update({name + ".safetensors": state for name, state in states.items()})
    if moe_layers(module):
        chosen = dsmoe.checkpoint.expert_writers(module, writes, layer_ids=layer_ids.dsmoe if layer_ids else None)
        files.update({name + ".safetensors": state for name, state in chosen.items()})
    for name, state in files.items():
        layer, expert = parse_expert_file(name)
        dsaio.save_state_dict({k: v.contiguous() for k, v in state.items()}, directory / name,
                              metadata=record(layer, expert))


def _first_of(group: Any) -> bool:
    return group is None or dist.get_rank(group) == 0


def expert_reader(directory: Path) -> Callable[[str], dict[str, torch.Tensor]]:
    """Reads one expert's file of a checkpoint directory by its name without suffix (dsmoe's and AutoEP's)."""
    def read(name: str) -> dict[str, torch.Tensor]:
        path = directory / (name + ".safetensors")
        if not path.is_file():
            raise CheckpointLoadError(f"{path} is missing: the checkpoint holds no such expert (was it saved from a "
                                      f"model with the same MoE layers and expert counts?)")
        return dsaio.load_state_dict(path)

    return read


def load_expert_files(module: torch.nn.Module, directory: Path, strict: bool = True, *, layer_ids: Any = None) -> None:
    """The experts this rank holds, from their files in `directory` (saved at any expert-parallel size)."""
    try:
        if autoep_layers(module):
            autoep.load_global_expert_states(module, expert_reader(directory),
                                             layer_ids=layer_ids.autoep if layer_ids else None)
        if moe_layers(module):
            dsmoe.load_local_experts(module, expert_reader(directory), strict=strict,
                                     layer_ids=layer_ids.dsmoe if layer_ids else None)
    except dsmoe.MoEError as exc:
        raise CheckpointLoadError(f"{directory}: {exc}") from None


def read_expert_files(directories: list[Path], stacked: dict[str, dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Every expert file in `directories` (a run's rank directories), whole: dsmoe's tensors by their names,
    AutoEP's slices stacked (experts split over tensor ranks have their files in each one's directory)."""
    whole: dict[str, torch.Tensor] = {}
    slices: dict[str, dict[int, torch.Tensor]] = {}
    for directory in directories:
        for path in sorted(directory.iterdir()):
            found = parse_expert_file(path.name)
            if found is None:
                continue
            for name, tensor in dsaio.load_state_dict(path).items():
                if name in stacked:
                    slices.setdefault(name, {})[found[1]] = tensor
                else:
                    whole[name] = tensor
    for name, by_expert in slices.items():
        total = stacked[name]["experts"]
        if sorted(by_expert) != list(range(total)):
            missing = sorted(set(range(total)) - set(by_expert))
            raise CheckpointLoadError(f"{directories[0].parent}: {name} has {total} experts but the files of "
                                      f"{missing[:8]} are missing")
        whole[name] = torch.stack([by_expert[e] for e in range(total)])
    return whole


# ---------------------------------------------------------------------------------------------- ZeRO state
def whole_stacked_states(zero_dir: Path, stacked: dict[str, dict[str, Any]], *, some: bool = False
                         ) -> dict[str, dict[str, torch.Tensor]]:
    """{stacked weight: {"master" / optimizer state key: every expert}} from a ZeRO checkpoint in which each
    expert-data group saved its experts' slice under the same name: shard file r held data rank r's
    experts (expert-parallel rank r % ep_size), each group's shards concatenated in group-rank order.
    Weights whose experts are split over tensor ranks: the slice of this directory's tensor rank, which
    every data rank here holds (SavedLayout.merge stacks the tensor ranks' slices). `some`: the directory holds
    some of the weights only (a pipeline stage's)."""
    try:
        index = ShardIndex(zero_dir)
        spread = {name: entry for name, entry in stacked.items() if entry.get("over") != "tensor"}
        local = {name: {**entry, "experts": entry["experts"] // entry["ep_size"], "ep_size": 1}
                 for name, entry in stacked.items() if entry.get("over") == "tensor"}
        return {**_whole_stacked(index, spread, some), **_whole_stacked(index, local, some)}
    except dszero.CheckpointError as exc:
        raise CheckpointLoadError(f"{zero_dir}: {exc}") from None


def _whole_stacked(index: ShardIndex, stacked: dict[str, dict[str, Any]], some: bool
                   ) -> dict[str, dict[str, torch.Tensor]]:
    groups: dict[tuple, dict[int, Any]] = {}  # (group key, expert-parallel rank) -> {group rank: entry}
    for entry in index.entries:
        names = [slot.name for slot in entry.layout.slots]
        if not any(name in stacked for name in names):
            continue
        if not all(name in stacked for name in names):
            raise dszero.CheckpointError(f"{entry.file.name}: a parameter group mixes AutoEP experts with other "
                                         f"parameters")
        ep_size = stacked[names[0]]["ep_size"]
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
        if some and not by_rank:
            continue  # held by another stage
        if not by_rank or sorted(by_rank) != list(range(stacked[name]["ep_size"])):
            raise dszero.CheckpointError(f"{name}: the checkpoint holds expert slices of expert-parallel ranks "
                                         f"{sorted(by_rank)} of {stacked[name]['ep_size']}")
        kinds = set.intersection(*(set(part) for part in by_rank.values()))
        whole[name] = {kind: torch.cat([by_rank[r][kind] for r in range(len(by_rank))]).clone() for kind in kinds}
    return whole
