"""Mixture-of-Students: the teacher's weights from a dstrain checkpoint.

    teacher = build_model(...)                              # the teacher's architecture
    dstrain.moe.load_teacher(teacher, "runs/teacher/checkpoints")   # latest tag, or tag=...
    mos = dstrain.moe.MixtureOfStudents(teacher, temperature=1.0, kd_weight=1.0, stop_step=400)

The checkpoint may come from any data- or expert-parallel size: the module file holds the dense
weights, the per-expert files the experts this rank's teacher holds (stage 3: the ZeRO shards).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

import dsaio
import dsmoe
import dszero
from dszero.checkpoint import verify_manifest

from ..errors import CheckpointLoadError
from ..wiring.dsmoe import expert_state_names, load_expert_states
from .engine_checkpoint import COMMON_FILE, MODEL_FILE, ZERO_DIR
from .paths import read_latest, tag_directory


def load_teacher(model: torch.nn.Module, load_dir: str | os.PathLike, tag: str | None = None,
                 strict: bool = True) -> torch.nn.Module:
    """Load `model` (the teacher) from the dstrain checkpoint `load_dir/<tag>` (default: latest), freeze
    it and put it in eval mode. MoE layers that have no expert groups yet take them from dscomm."""
    root = Path(load_dir)
    tag = tag if tag is not None else read_latest(root)
    if tag is None:
        raise CheckpointLoadError(f"load_teacher: no 'latest' file in {root}; pass tag= to name the checkpoint")
    path = tag_directory(root, tag)
    try:
        verify_manifest(path)
    except dszero.CheckpointError as exc:
        raise CheckpointLoadError(f"load_teacher: {exc}") from None
    for _, layer in dsmoe.moe_layers(model):
        if layer.ep_size > 1 and layer.deepspeed_moe.ep_group is None:
            layer.set_deepspeed_parallelism()
    saved = dsaio.load_state_dict(path / MODEL_FILE)
    if int(dsaio.load_state_dict(path / COMMON_FILE).get("zero_stage", 0)) == 3:
        saved = {**dszero.get_fp32_state_dict_from_zero_checkpoint(path / ZERO_DIR), **saved}
    current = model.state_dict()
    expected = set(current) - expert_state_names(model)
    missing, unexpected = sorted(expected - set(saved)), sorted(set(saved) - expected)
    if strict and (missing or unexpected):
        raise CheckpointLoadError(f"load_teacher: {path / MODEL_FILE} does not match the teacher: missing "
                                  f"{missing[:5]}, unexpected {unexpected[:5]} (strict=False loads what matches)")
    with torch.no_grad():
        for name in expected & set(saved):
            if current[name].shape != saved[name].shape:
                raise CheckpointLoadError(f"load_teacher: {name} has shape {tuple(saved[name].shape)} in {path} but "
                                          f"{tuple(current[name].shape)} in the teacher")
            current[name].copy_(saved[name])
    load_expert_states(model, path, strict=strict)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model
