"""What a stage partitions: what each rank holds of the parameters, master weights and optimizer state.

- `FlatGroups`: every optimizer parameter group becomes one flat buffer that every rank holds whole
  (the model's parameters are views of it). `sharded`: its master weights and optimizer state are
  cut into one shard per rank (stages 1-2); otherwise every rank keeps them whole (stage 0).
- `PartitionedUnits`: the parameters are partitioned too, one unit per module and group (stage 3,
  units.py); a rank keeps only its shards, in their homes (device, CPU or NVMe: offload_param).

Each builds the groups the optimizer steps (`build`) and answers for them: what a rank holds in
memory, how a master is taken from the model's weights, which settings it used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

import dscomm

from ..errors import ZeroConfigError, ZeroError
from ..flat import FlatGroup
from ..layout import GroupLayout
from ..offload.param_homes import ParamHomes
from ..precision import Precision
from ..units import Unit, partition_units, untrained_units

if TYPE_CHECKING:
    from ..optimizer import ZeroOptimizer


class FlatGroups:
    partitions_parameters = False

    def __init__(self, sharded: bool):
        self.sharded = sharded

    @property
    def shards_optimizer_state(self) -> bool:
        return self.sharded

    @property
    def whole_tensors(self) -> bool:
        """Whether every rank holds every master tensor whole (tensor_views works)."""
        return not self.sharded

    def build(self, zero: ZeroOptimizer, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
              group_settings: list[dict[str, Any]]) -> list[FlatGroup]:
        """The flat groups, the optimizer's groups rebound to their masters; group_settings: each group's
        process group, divisor and norm replicas (ZeroOptimizer.GROUP_KEYS)."""
        if any(getattr(p, "_dszero_unit", None) is not None for p in module.parameters()):
            raise ZeroConfigError(f"the module's parameters are partitioned (built inside dszero.Init, or wrapped by a "
                                  f"stage-3 ZeroOptimizer); zero_optimization.stage must be 3, not {zero.stage}")
        if optimizer.state:
            raise ZeroError("the optimizer already has state (it has stepped); wrap it in ZeroOptimizer before the "
                            "first step, or load its state after wrapping")
        names = {id(p): name for name, p in module.named_parameters()}
        groups = []
        alignment = 4  # 16 bytes of fp32 per shard boundary
        for index, param_group in enumerate(optimizer.param_groups):
            params = [p for p in param_group["params"] if p.requires_grad]
            unknown = [p for p in params if id(p) not in names]
            if unknown:
                raise ZeroError(f"optimizer param group {index} holds {len(unknown)} tensor(s) that are not parameters "
                                f"of the module (first shape {tuple(unknown[0].shape)}); build the optimizer from "
                                f"module.parameters()")
            if not params:
                raise ZeroError(f"optimizer param group {index} has no trainable parameters")
            _check_dtypes(index, params, zero.precision)
            dtypes = {p.dtype for p in params}
            if len(dtypes) > 1:
                raise ZeroError(f"optimizer param group {index} mixes dtypes {sorted(map(str, dtypes))}; cast the model "
                                f"to one dtype (model.to(dtype)) before wrapping")
            settings = group_settings[index]
            process_group = settings["group"]
            world = dist.get_world_size(process_group) if self.sharded else 1
            layout = GroupLayout.build([names[id(p)] for p in params], [p.shape for p in params], world, alignment)
            shard_rank = dist.get_rank(process_group) if self.sharded else 0
            offload = zero.config.offload_optimizer
            flat = FlatGroup(params, [names[id(p)] for p in params], layout, shard_rank,
                             zero.precision.master_torch_dtype, offload=zero.offload,
                             pin_memory=bool(offload and offload.pin_memory), group=process_group,
                             average_over=settings["average_over"], norm_replicas=settings["norm_replicas"])
            param_group["params"] = [flat.master_param]
            groups.append(flat)
        _broadcast_initial_weights(groups)
        return groups

    def master_from_model(self, group: FlatGroup) -> None:
        group.master.copy_(group.model_shard())

    def parameter_bytes(self, groups: list[FlatGroup]) -> list[tuple[str, str, int]]:
        """(kind, place, bytes) of what this rank holds of the parameters."""
        return [("parameters", "device", g.model_flat.numel() * g.model_flat.element_size()) for g in groups]

    def settings(self) -> dict[str, int]:
        return {}


def _check_dtypes(index: int, params: list[torch.Tensor], precision: Precision) -> None:
    wrong = {p.dtype for p in params} - {precision.torch_dtype}
    if wrong:
        raise ZeroError(f"optimizer param group {index} has parameters of {sorted(map(str, wrong))} but the "
                        f"precision is {precision.dtype}; call model.to({precision.torch_dtype}) first, "
                        f"or choose the matching precision")


def _broadcast_initial_weights(groups: list[FlatGroup]) -> None:
    # Every rank starts from its group's rank 0's weights, as DDP does.
    for flat in groups:
        if dist.get_world_size(flat.group) > 1:
            src = dist.get_global_rank(flat.group, 0) if flat.group is not None else 0
            dscomm.broadcast(flat.model_flat, src, group=flat.group, log_name="zero_broadcast_weights")
        if flat.separate_master:
            flat.master.copy_(flat.model_shard())


class PartitionedUnits:
    partitions_parameters = True
    shards_optimizer_state = True
    whole_tensors = False

    def __init__(self) -> None:
        self.homes: ParamHomes | None = None  # where each unit's shard lives between uses
        self.persistence_threshold = 0

    def build(self, zero: ZeroOptimizer, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
              group_settings: list[dict[str, Any]]) -> list[Unit]:
        if optimizer.state:
            raise ZeroError("the optimizer already has state (it has stepped); wrap it in ZeroOptimizer first")
        for index, param_group in enumerate(optimizer.param_groups):
            _check_dtypes(index, [p for p in param_group["params"] if p.requires_grad], zero.precision)
        self.persistence_threshold = zero.config.stage3_param_persistence_threshold
        offload = zero.config.offload_optimizer
        self.homes = ParamHomes(zero.config.offload_param, dist.get_rank(), zero.aio)
        units = partition_units(module, optimizer, zero.process_group, zero.precision.master_torch_dtype,
                                self.persistence_threshold, homes=self.homes,
                                master_device=torch.device("cpu") if zero.offload else None,
                                pin_master=bool(zero.offload and offload.pin_memory),
                                own_master=zero.offload,  # offloaded masters get their own host buffers
                                group_settings=group_settings)
        # dszero.Init's units the optimizer does not train (frozen) stay gathered under the threshold too, as DeepSpeed
        # keeps every small parameter whole; every rank meets them in the same order (set_persistent gathers).
        for unit in untrained_units(module):
            if unit.layout.numel < self.persistence_threshold:
                unit.set_persistent(True)
        # norm_replicas needs no group of its own: each unit counts its replicas in the norm (tensor parallel).
        unit_of = {id(unit.master_param): unit for unit in units}
        for settings, param_group in zip(group_settings, optimizer.param_groups):
            for master in param_group["params"]:
                unit_of[id(master)].norm_replicas = settings["norm_replicas"]
        return units

    def master_from_model(self, unit: Unit) -> None:
        unit.master.copy_(unit.home.fetch())
        unit.home.done()

    def parameter_bytes(self, units: list[Unit]) -> list[tuple[str, str, int]]:
        entries = [("parameters", u.home.where, u.home.nbytes) for u in units]
        if self.homes is not None:
            entries.append(("offload_buffers", "cpu", self.homes.buffer_bytes()))
        return entries

    def settings(self) -> dict[str, int]:
        used = {"stage3_param_persistence_threshold": self.persistence_threshold}
        if self.homes is not None and self.homes.device == "nvme":
            used["offload_param.buffer_size"] = self.homes._buffer_numel()
        return used
