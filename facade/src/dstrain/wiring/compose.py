"""Compose the parallelisms onto a model in one place and one order, as torchtitan's `parallelize` does.

initialize() calls `compose()` after the layout's groups exist and before the optimizer is built.
The order is fixed, and each step says why it comes where it does:

1. tensor parallel (dstp)    - shards weights first, so everything after sees the per-rank shapes;
2. experts (dsmoe)           - MoE layers get their expert groups; AutoEP swaps HF MoE blocks;
3. random-LTD (dsdata)       - wraps whole layers, after their insides are final;
4. activation checkpointing  - around the (wrapped) layers, configured from the config;
5. pipeline split (dspipe)   - a PipelineModule builds only its stage's layers;
6. ZeRO over the data axis   - parts.build_training_parts, from the parameter groups returned here:
                               tagged groups (experts, tensor-replicated weights, tied pipeline
                               weights) carry the process group / divisor / norm replicas dszero reads.

Each step lives in the module of the library's wiring (facade/src/dstrain/wiring/<lib>.py) and is a
no-op when its feature is off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dsconfig import DeepSpeedConfig

from .dsdata import apply_random_ltd  # 3. dsdata
from .dsmoe import apply_experts  # 2. dsmoe
from .dspipe import apply_pipeline_split  # 5. dspipe
from .dstp import apply_tensor_parallel  # 1. dstp


@dataclass
class Composed:
    """The model to train and what the rest of initialize() needs from the composition."""

    model: torch.nn.Module
    model_parameters: Any  # what the optimizer is built from: parameters, or groups dszero reads keys of
    step_hooks: list[Any] = field(default_factory=list)  # called after each optimizer step with the global step


def compose(model: torch.nn.Module, config: DeepSpeedConfig, groups: Any, model_parameters: Any) -> Composed:
    """Apply every parallelism the config turns on to `model`, in the order above."""
    composed = Composed(model, model_parameters)
    for step in STEPS:
        composed = step(composed, config, groups)
    return composed


def _unchanged(composed: Composed, config: DeepSpeedConfig, groups: Any) -> Composed:
    return composed


# The steps, in order. A library's wiring replaces its placeholder with its own function.
apply_activation_checkpointing = _unchanged  # 4. configured by parts from the config's section

STEPS = (apply_tensor_parallel, apply_experts, apply_random_ltd, apply_activation_checkpointing,
         apply_pipeline_split)
