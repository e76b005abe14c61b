"""What every pipeline stage holds, for the composition steps that must agree across stages: a pipeline rank
builds only its stage's layers, but a tensor plan, the expert groups and a checkpoint's layout are the whole
model's. Collective over the pipe group; plain JSON data travels (nothing is pickled)."""

from __future__ import annotations

import json
from typing import Any

import torch

from .dspipe import is_pipeline_module


def several_stages(model: torch.nn.Module, groups: Any) -> bool:
    """Whether `model` is a pipeline whose stages live on several ranks (each holding some layers only)."""
    return is_pipeline_module(model) and groups is not None and groups.size("pipe") > 1


def across_stages(value: Any, model: torch.nn.Module, groups: Any) -> list[Any]:
    """`value` of every stage of `model`'s pipeline, in stage order ([value] for a model that is not a
    pipeline of several stages). Every rank calls it."""
    if not several_stages(model, groups):
        return [value]
    return all_gather_json(value, groups.pipe)


def all_gather_json(value: Any, group: Any) -> list[Any]:
    """`value` (plain JSON data) from every rank of `group`, in group-rank order."""
    payload = torch.tensor(list(json.dumps(value).encode()), dtype=torch.uint8)
    world = torch.distributed.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    torch.distributed.all_gather(sizes, torch.tensor([payload.numel()], dtype=torch.int64), group=group)
    longest = max(int(size.item()) for size in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:payload.numel()] = payload
    buffers = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    torch.distributed.all_gather(buffers, padded, group=group)
    return [json.loads(bytes(buf[:int(size.item())].tolist()).decode()) for buf, size in zip(buffers, sizes)]
