"""`save_16bit_model`: the whole model in its training dtype, as one file that loads into the model's own
class (Hugging Face's from_pretrained reads the torch format of .bin/.pt; other names get safetensors):
ZeRO stage 3's partitions gathered, AutoEP's experts gathered to the original [experts, ...] tensors,
tensor-parallel shards gathered over the tensor group and merged by the plan."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import dsaio
import dscomm
import dszero

from ..wiring.autoep import whole_state_dict
from .layout import RunLayout, dstp
from .module_weights import frozen_names

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts


def save_16bit_model(parts: TrainingParts, save_dir: Any, save_filename: str, *,
                     exclude_frozen_parameters: bool = False) -> bool:
    """Written by the first data-parallel rank (the first rank of all with tensor parallelism); at stage 3
    this needs stage3_gather_16bit_weights_on_model_save. exclude_frozen_parameters leaves out those with
    requires_grad False."""
    layout = RunLayout.of(parts)
    partitioned = parts.optimizer is not None and parts.optimizer.partitions_parameters
    if partitioned and not parts.config.zero_optimization.stage3_gather_16bit_weights_on_model_save:
        warnings.warn("save_16bit_model at ZeRO stage 3 needs zero_optimization."
                      "stage3_gather_16bit_weights_on_model_save: true; nothing saved", stacklevel=3)
        return False
    whole = whole_16bit_state_dict(parts, exclude_frozen_parameters=exclude_frozen_parameters)
    writes = whole is not None
    if writes:
        target = Path(save_dir) / save_filename
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.suffix in (".bin", ".pt", ".pth"):
            torch.save(whole, target)  # the format Hugging Face's from_pretrained reads
        else:
            dsaio.save(whole, target)
    dscomm.barrier(group=layout.world_group if layout.tensor is not None else layout.dp_group)
    return True


def whole_16bit_state_dict(parts: TrainingParts, *, exclude_frozen_parameters: bool = False
                           ) -> dict[str, torch.Tensor] | None:
    """The whole model's state dict in its training dtype (ZeRO-3 shards, AutoEP's experts and tensor-parallel
    shards gathered) on the rank that writes it (global rank 0 with tensor parallelism, else the first
    data-parallel rank), None on the others; every rank calls it (it gathers)."""
    layout = RunLayout.of(parts)
    module = parts.module
    left_out = set(frozen_names(module)) if exclude_frozen_parameters else set()
    writes = dscomm.get_rank() == 0 if layout.tensor is not None else layout.dp_rank == 0
    whole: dict[str, torch.Tensor] = {}
    with dszero.GatheredParameters(list(module.parameters())):  # stages 0-2: the parameters pass through
        state = whole_state_dict(module, module.state_dict())  # AutoEP's experts gathered (every rank)
        for name, value in state.items():
            if name in left_out:
                continue
            if layout.tensor is not None:
                value = _merged_over_tensor_ranks(layout, name, value)
            if writes:
                whole[name] = value.detach().clone()
    return whole if writes else None


def _merged_over_tensor_ranks(layout: RunLayout, name: str, value: torch.Tensor) -> torch.Tensor:
    plan = layout.tensor.plan.params.get(name)
    if plan is None or not plan.sharded:
        return value
    shards = [torch.empty_like(value) for _ in range(layout.tensor.tp_size)]
    torch.distributed.all_gather(shards, value.detach().contiguous(), group=layout.tensor.tensor_group.group)
    return dstp.merge_shards(shards, plan)
