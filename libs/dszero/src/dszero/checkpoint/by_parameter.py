"""A ZeRO checkpoint seen parameter by parameter, for libraries that reshape parameters between saves
(tensor parallelism at another degree merges and re-cuts each one): every parameter's fp32 master and
per-element optimizer state whole, and loading such per-parameter states into any optimizer layout.

    states, scalars = read_parameter_states(directory)       # {name: {"master": t, "exp_avg": t, ...}}
    load_parameter_states(zero, states, scalars)             # cut into this rank's shards of each group
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from ..errors import CheckpointError
from .shard_index import ShardIndex
from .sharded import read_meta, resolve_directory

if TYPE_CHECKING:
    from ..optimizer import ZeroOptimizer

MASTER = "master"


def read_parameter_states(directory: str | os.PathLike) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """({parameter name: {"master": fp32 tensor, <state key>: tensor}}, the optimizer's per-group scalars such as
    "step", from the first group that has them). Every shard of every group is read; a missing one is an error."""
    path = resolve_directory(directory)
    read_meta(path)  # verifies the manifest
    index = ShardIndex(path)
    states: dict[str, dict[str, torch.Tensor]] = {}
    scalars: dict[str, Any] = {}
    for layout, shards in index.complete_groups():
        first = shards[0][0]
        scalars = scalars or dict(first.scalars)
        for kind in [MASTER, *index.state_keys(first)]:
            tensor_name = kind if kind == MASTER else f"state.{kind}"
            flat = torch.cat([index.tensor(shards[r][0], tensor_name) for r in range(layout.world_size)])
            for slot in layout.slots:
                states.setdefault(slot.name, {})[kind] = flat[slot.offset:slot.end].view(slot.shape).clone()
    return states, scalars


def load_parameter_states(zero: ZeroOptimizer, states: dict[str, dict[str, torch.Tensor]], scalars: dict[str, Any],
                          load_optimizer_states: bool = True) -> None:
    """Cut per-parameter masters (and optimizer states) into `zero`'s groups, whatever their layout; the
    model's weights follow the masters. Collective at stages 1-3 (the updated shards are shared)."""
    names = {slot.name for group in zero.groups for slot in group.layout.slots}
    missing = sorted(names - set(states))
    if missing:
        raise CheckpointError(f"per-parameter states lack {missing[:5]}{'...' if len(missing) > 5 else ''}")
    with zero.stepper.resident(write_back=True):
        optimizer_state: dict[int, dict[str, Any]] = {}
        for position, group in enumerate(zero.groups):
            kinds = [MASTER] + (sorted(set.intersection(*(set(states[s.name]) for s in group.layout.slots)) - {MASTER})
                                if load_optimizer_states else [])
            per_kind = {}
            for kind in kinds:
                sample = states[group.layout.slots[0].name][kind]
                dtype = group.master.dtype if kind == MASTER else sample.dtype
                shard = torch.zeros(group.shard_numel, dtype=dtype)
                lo, _ = group.layout.shard_range(group.shard_rank)
                for slot, start, end in group.layout.pieces_in_shard(group.shard_rank):
                    value = states[slot.name][kind]
                    if tuple(value.shape) != tuple(slot.shape):
                        raise CheckpointError(f"{slot.name}: {kind} has shape {tuple(value.shape)}, the parameter "
                                              f"{tuple(slot.shape)}")
                    at = slot.offset + start - lo
                    shard[at: at + end - start].copy_(value.reshape(-1)[start:end].to(dtype))
                per_kind[kind] = shard
            group.master.copy_(per_kind.pop(MASTER).to(device=group.master.device))
            if per_kind:
                optimizer_state[position] = {key: value.to(group.master.device) for key, value in per_kind.items()}
                for key, value in scalars.items():
                    optimizer_state[position][key] = torch.tensor(value, dtype=torch.float32) if key == "step" \
                        else value
        if load_optimizer_states and optimizer_state:
            current = zero.optimizer.state_dict()
            zero.optimizer.load_state_dict({"state": optimizer_state, "param_groups": current["param_groups"]})
        zero._share_updated_weights()
