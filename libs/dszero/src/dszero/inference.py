"""ZeRO stage 3 without an optimizer: a model that only runs forward (an evaluation model, RLHF's reference and
reward models) keeps its parameters partitioned, and each module gathers its own just before its forward and
releases them after it. What DeepSpeed's engine does when `initialize()` gets no optimizer at stage 3.

    dszero.ZeroInference(model, zero_config)      # partitions what dszero.Init did not, hooks every module
    with torch.no_grad():
        logits = model(tokens)                     # each layer's weights are whole only while it runs

Parameters built under `dszero.Init` stay in their shards (re-cut once if the module was moved or cast after
it); the others are partitioned now. Units smaller than `stage3_param_persistence_threshold` elements stay
gathered. A forward that autograd records with parameters requiring grad keeps its weights gathered (backward
reads them); under `torch.no_grad()`, or with frozen parameters, they are released after each module.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dsconfig import ZeroConfig

from .init import param_offload
from .offload.param_homes import ParamHomes
from .stage3 import FUSED_MODULES, Unit


class ZeroInference:
    def __init__(self, module: torch.nn.Module, zero: ZeroConfig | None = None, group: Any = None):
        self.group = group
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        threshold = zero.stage3_param_persistence_threshold if zero is not None else 0
        threshold = threshold if isinstance(threshold, int) else 0  # "auto" left unresolved: partition everything
        homes = ParamHomes(param_offload(zero, None, False), dist.get_rank(), None)
        self.units: dict[int, list[Unit]] = {}
        covered: set[int] = set()
        for sub in module.modules():
            if id(sub) in covered:
                continue
            if isinstance(sub, FUSED_MODULES):  # its forward reads its children's weights without calling them
                covered.update(id(m) for m in sub.modules() if m is not sub)
                named = list(sub.named_parameters())
            else:
                named = list(sub.named_parameters(recurse=False))
            units: dict[int, Unit] = {}
            for name, param in named:
                unit = getattr(param, "_dszero_unit", None)
                if unit is None or unit.dtype != param.dtype or unit.model_flat.device != param.device:
                    # Not partitioned yet, or partitioned by Init before the module was cast or moved.
                    unit = Unit(sub, [param], [f"{type(sub).__name__}.{name}"], world, rank, param.dtype,
                                persistent=False, group=group, homes=homes, partition_only=True)
                if unit.layout.numel < threshold and not unit.persistent:
                    unit.gather()
                    unit.persistent = True  # small: kept whole, as stage 3 keeps such units
                units.setdefault(id(unit), unit)
            if units:
                self.units[id(sub)] = list(units.values())
                # First, so dszero.Init's guard against calling a partitioned module sees the weights gathered.
                sub.register_forward_pre_hook(self._gather, prepend=True)
                sub.register_forward_hook(self._release)

    def _gather(self, module: torch.nn.Module, args: Any) -> None:
        for unit in self.units[id(module)]:
            unit.gather(compute=True)

    def _release(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        units = self.units[id(module)]
        if torch.is_grad_enabled() and any(p.requires_grad for u in units for p in u.params):
            return  # autograd saved views of these weights for backward
        for unit in units:
            unit.release()
