"""`deepspeed.checkpoint.utils`: `clone_tensors_for_torch_save` and the names of DeepSpeed's checkpoint files."""

from __future__ import annotations

import os
from typing import Any

import torch

from ...checkpoint.deepspeed.constants import (
    LAYER_FILE_PREFIX,
    MODEL_FILE_PREFIX,
    MODEL_FILE_SUFFIX,
    OPTIM_FILE_SUFFIX,
    ZERO_FILE_PREFIX,
)


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


def get_model_ckpt_name_for_rank(base_folder: str, mp_rank_str: str) -> str:
    """DeepSpeed's model-states file of a model-parallel rank (`mp_rank_str`: two digits, "00")."""
    return os.path.join(base_folder, f"{MODEL_FILE_PREFIX}{mp_rank_str}{MODEL_FILE_SUFFIX}")


def get_zero_ckpt_name_for_rank(base_folder: str, dp_rank: int, mp_rank: int) -> str:
    """DeepSpeed's ZeRO optimizer-states file of a (data, model-parallel) rank."""
    return os.path.join(base_folder, f"{ZERO_FILE_PREFIX}{dp_rank}_{MODEL_FILE_PREFIX}{mp_rank:02d}{OPTIM_FILE_SUFFIX}")


def get_layer_ckpt_name_for_rank(base_folder: str, layer_id: str, tp_rank: str) -> str:
    """DeepSpeed's file of a pipeline layer's weights at a tensor rank (`layer_id`, `tp_rank`: "01", "00")."""
    return os.path.join(base_folder, f"{LAYER_FILE_PREFIX}{layer_id}-model_{tp_rank}{MODEL_FILE_SUFFIX}")
