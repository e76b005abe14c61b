"""`deepspeed.checkpoint.utils.clone_tensors_for_torch_save`."""

from __future__ import annotations

from typing import Any

import torch


def clone_tensors_for_torch_save(item: Any, device: torch.device | str = "cpu") -> Any:
    """`item` with every tensor (nested in lists, tuples and dicts) copied to `device` on its own storage, so
    torch.save writes each tensor's elements and not the whole storage a view shares (a slice of a flat ZeRO
    buffer would otherwise carry the buffer)."""
    if torch.is_tensor(item):
        return item.detach().to(device, copy=True)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)((k, clone_tensors_for_torch_save(v, device)) for k, v in item.items())
    return item
