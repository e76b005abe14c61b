"""`deepspeed.utils.zero_to_fp32`: consolidate a ZeRO checkpoint into one fp32 state dict (from dszero)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from dszero import convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint

from ...checkpoint.paths import read_latest, tag_directory
from ...errors import CheckpointLoadError


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir: str | os.PathLike,
                                         tag: str | None = None) -> torch.nn.Module:
    """Load the consolidated fp32 weights of a checkpoint into `model` (on the CPU) and return it.

    `checkpoint_dir` is the directory `save_checkpoint` wrote (its tags and `latest`); a dstrain
    checkpoint keeps its ZeRO shards under `<tag>/zero`."""
    root = Path(os.fspath(checkpoint_dir))
    tag = tag if tag is not None else read_latest(root)
    zero_dir = tag_directory(root, tag) / "zero" if tag is not None else root
    state: dict[str, Any] = get_fp32_state_dict_from_zero_checkpoint(zero_dir)
    model = model.cpu()
    _buffers_left_as_they_are, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise CheckpointLoadError(f"{zero_dir}: the checkpoint has parameters the model lacks: {unexpected[:5]}")
    return model


__all__ = ["convert_zero_checkpoint_to_fp32_state_dict", "get_fp32_state_dict_from_zero_checkpoint",
           "load_state_dict_from_zero_checkpoint"]
