"""Mixture-of-Students: the teacher's weights from a dstrain checkpoint.

    teacher = build_model(...)                              # the teacher's architecture
    dstrain.moe.load_teacher(teacher, "runs/teacher/checkpoints")   # latest tag, or tag=...
    mos = dstrain.moe.MixtureOfStudents(teacher, temperature=1.0, kd_weight=1.0, stop_step=400)

The checkpoint may come from any data- or expert-parallel size: it is read whole (whole.py: the module
file, every expert's file, at stage 3 the fp32 masters) and the teacher takes what it holds.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

import dsmoe

from ..errors import CheckpointLoadError
from .layout import RunLayout
from .module_weights import apply_module_state
from .paths import checked_load_tag, checkpoint_path, read_latest
from .saved import SavedCheckpoint
from .whole import read_saved


def load_teacher(model: torch.nn.Module, load_dir: str | os.PathLike, tag: str | None = None,
                 strict: bool = True) -> torch.nn.Module:
    """Load `model` (the teacher) from the dstrain checkpoint `load_dir/<tag>` (default: latest), freeze
    it and put it in eval mode. MoE layers that have no expert groups yet take them from dscomm."""
    root = Path(load_dir)
    tag = checked_load_tag(tag) if tag is not None else read_latest(root)
    if tag is None:
        raise CheckpointLoadError(f"load_teacher: no 'latest' file in {root}; pass tag= to name the checkpoint")
    for _, layer in dsmoe.moe_layers(model):
        if layer.ep_size > 1 and layer.deepspeed_moe.ep_group is None:
            layer.set_deepspeed_parallelism()
    whole = read_saved(SavedCheckpoint.open(checkpoint_path(root, tag)))
    apply_module_state(RunLayout.of_module(model), whole.module, strict=strict, left_out=set(whole.left_out),
                       gathered=False, where=f"load_teacher: {whole.path}")
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model
