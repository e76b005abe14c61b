"""Stage 3's units: one module's parameters of one optimizer group, partitioned over the ranks.

`partition_units` cuts a module into units (what stage 3 partitions); a `Unit` keeps this rank's
shard in its home and gathers the whole parameters into its flat buffer when asked, releasing them
after. When units are gathered and their gradients reduced is the business of their schedule
(stage3.py's hooks); checkpoints, ZeRO++ and dszero.Init use the units alone.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

import dscomm

from .errors import ZeroError
from .layout import GroupLayout
from .leaf_modules import z3_leaf_module
from .offload.param_homes import DeviceHome
from .offload.pinned import host_copy
from .status import ZeroParamStatus, next_param_id
from .wire import gather_shards

# Modules whose forward uses their children's parameters directly (not by calling the children).
FUSED_MODULES: tuple[type, ...] = (torch.nn.MultiheadAttention,)


def gathered_whole(module: torch.nn.Module) -> bool:
    """Whether stage 3 gathers all of `module`'s parameters (its children's too) as one unit at its forward: a
    fused module, or one marked as a leaf (set_z3_leaf_modules)."""
    return isinstance(module, FUSED_MODULES) or z3_leaf_module(module)


class Unit:
    """One module's parameters of one optimizer group, partitioned over the data-parallel ranks.

    The shard lives in `home` (the device, a CPU buffer or an NVMe file: see offload.param_homes);
    the master weights on `master_device`, shared with the shard when dtype and place agree.
    """

    routes: Any = None  # ZeRO++ (zeropp/): how forward/backward gathers travel; None: the plain all-gather
    average_over: int | None = None  # what the unit's summed gradient is divided by (None: its group's size)

    tally: list[int] | None = None  # Stage3's running count of gathered partitioned elements (max_live_parameters)
    _gathered = False
    held = False  # HeldParameters (held.py): gathered for a whole block of forwards; the hooks leave it alone
    scheduled = False  # a stage-3 schedule (stage3.py) gathers it before its modules' forward

    @property
    def gathered(self) -> bool:
        return self._gathered

    @gathered.setter
    def gathered(self, value: bool) -> None:
        if value != self._gathered and self.tally is not None and not self.persistent:
            self.tally[0] += self.layout.padded_numel if value else -self.layout.padded_numel
        self._gathered = value
        self._publish_status()

    def _publish_status(self) -> None:
        """DeepSpeed's param.ds_status on every parameter of the unit (status.py)."""
        status = (ZeroParamStatus.NOT_AVAILABLE if not self._gathered else
                  ZeroParamStatus.INFLIGHT if getattr(self, "pending", None) is not None else ZeroParamStatus.AVAILABLE)
        for param in self.params:
            param.ds_status = status

    def __init__(self, module: torch.nn.Module, params: list[torch.nn.Parameter], names: list[str], world: int,
                 rank: int, master_dtype: torch.dtype, persistent: bool, group: Any, homes: Any = None,
                 master_device: torch.device | None = None, pin_master: bool = False, own_master: bool = False,
                 partition_only: bool = False):
        self.module = module
        self.partition_only = partition_only  # dszero.Init's units: a shard to gather, no optimizer side
        self.params = params
        self.names = names
        self.layout = GroupLayout.build(names, [full_shape(p) for p in params], world, alignment=4)
        self.shard_rank = rank
        self.group = group
        self.persistent = persistent
        self.dtype = params[0].dtype
        device = params[0].device
        self.model_flat = torch.zeros(self.layout.padded_numel, dtype=self.dtype, device=device)
        for param, slot in zip(params, self.layout.slots):
            view = self.model_flat[slot.offset:slot.end].view(slot.shape)
            copy_full_value(param, view)
            param.data = view
        if world > 1:  # every rank starts from rank 0's weights
            dscomm.broadcast(self.model_flat, dist.get_global_rank(group, 0) if group is not None else 0, group=group,
                             log_name="zero3_broadcast_weights")
        lo, hi = self.layout.shard_range(rank)
        shard = self.model_flat[lo:hi]
        self.home = homes.make(shard) if homes is not None else DeviceHome(shard)
        master_device = master_device or device
        resident = self.home.resident()
        if partition_only:
            self.separate_master, self.master, self.master_param = False, None, None
        else:
            # own_master: the master must not share the shard's memory (optimizer offload keeps it apart).
            self.separate_master = own_master or not (master_dtype == self.dtype and resident is not None
                                                      and resident.device == master_device)
            if not self.separate_master:
                self.master = resident
            elif master_device.type == "cpu":  # optimizer offload: the master in its own host buffer
                self.master = host_copy(shard, master_dtype, pin_master, "zero_optimization.offload_optimizer")
            else:
                self.master = shard.to(device=master_device, dtype=master_dtype, copy=True)
            self.master_param = torch.nn.Parameter(self.master, requires_grad=False)
        self.master_writer: Any = None  # set when the master lives in a swap file (NVMe optimizer offload)
        for param, slot in zip(params, self.layout.slots):
            param._dszero_unit = self  # lets GatheredParameters find the unit of any parameter
            param.ds_shape, param.ds_numel = slot.shape, slot.numel  # DeepSpeed's names, for user code
            if not hasattr(param, "ds_id"):  # kept when a stage-3 optimizer takes over dszero.Init's unit
                param.ds_id = next_param_id()
            if resident is not None:  # DeepSpeed's name for the piece this rank stores: a view of the home shard,
                first, last = max(lo, slot.offset), min(hi, slot.end)  # its length where the unit's cut falls
                param.ds_tensor = resident[first - lo:last - lo] if first < last else resident[:0]
        self.gathered = True
        self.pending: Any = None  # the handles of an asynchronous (prefetch) gather still in flight
        self.gather_count = 0  # all-gathers done, for tests and reports
        self.prefetch_count = 0  # of which launched ahead of need
        self.grad_shard = torch.zeros(0 if partition_only else self.layout.shard_numel, dtype=self.dtype, device=device)
        self.empty = torch.empty(0, dtype=self.dtype, device=device)  # what released params hold
        self.release()

    @property
    def shard_numel(self) -> int:
        return self.layout.shard_numel

    def gather(self, compute: bool = False) -> None:
        """Whole parameters now (waiting for a prefetch in flight). compute: for forward or backward, which
        ZeRO++ may serve quantized or from the node; otherwise the exact weights."""
        if self.pending is not None:
            self._finish()
        if not self.gathered:
            self._start(async_op=False, compute=compute)

    def gather_async(self) -> None:
        """Launch the all-gather (for compute) and return; the next gather() (or release()) waits for it."""
        if not self.gathered:
            self.prefetch_count += 1
            self._start(async_op=True, compute=True)

    @property
    def resident(self) -> bool:
        """Gathered, with nothing in flight."""
        return self.gathered and self.pending is None

    def _start(self, async_op: bool, compute: bool = False) -> None:
        if self.model_flat.numel() != self.layout.padded_numel:  # the last buffer went to its readers (release)
            self.model_flat = torch.empty(self.layout.padded_numel, dtype=self.dtype, device=self.model_flat.device)
        else:
            storage = self.model_flat.untyped_storage()
            storage.resize_(self.layout.padded_numel * self.model_flat.element_size())
        self.gather_count += 1
        if compute and self.routes is not None:
            self.pending = self.routes.gather(self, async_op=async_op)
        else:
            shard = self.home.fetch()
            self.pending = gather_shards(self.model_flat, shard, self.group, async_op=async_op,
                                         log_name="zero3_gather")
        if self.pending is None:
            self.home.done()
        for param, slot in zip(self.params, self.layout.slots):
            param.data = self.model_flat[slot.offset:slot.end].view(slot.shape)
        self.gathered = True

    def _finish(self) -> None:
        self.pending.wait()
        self.pending = None
        self.home.done()  # the shard's fetched copy (an NVMe read buffer) may go only now
        self._publish_status()

    def gather_into(self, full: torch.Tensor, async_op: bool = False) -> Any:
        """All-gather the unit's whole flat weights (padded) into `full`, a buffer the caller owns, leaving
        the unit's own buffer as it is: how a compiled graph gets whole parameters whose memory it frees
        itself. With async_op, returns what to wait() on before reading `full`."""
        shard = self.home.fetch()
        handle = gather_shards(full, shard, self.group, async_op=async_op, log_name="zero3_gather")
        self.gather_count += 1
        if handle is None:
            self.home.done()
            return None
        return _HomeRelease(handle, self.home)

    def set_persistent(self, persistent: bool) -> None:
        """Keep the unit gathered from now on (a compiler's selective gather), or partition it again."""
        if persistent == self.persistent:
            return
        if self.gathered and self.tally is not None:  # persistent units are not counted as live
            self.tally[0] += -self.layout.padded_numel if persistent else self.layout.padded_numel
        self.persistent = persistent
        if persistent:
            self.gather()
        else:
            self.release()

    def release(self, leave_to_readers: bool = False) -> None:
        """Partition the parameters again. leave_to_readers: a tensor taken from a gathered parameter keeps the
        whole weights (GatheredParameters' exit, as DeepSpeed's release swaps param.data and leaves the old
        memory to whoever holds it: `w = p.data` kept after the block, or `p.data.cpu()`, which on a CPU is
        no copy); the buffer goes to those readers, freed with the last of them, and the next gather takes a
        new one. Otherwise (the forward/backward hooks) the buffer's memory is freed in place and the next
        gather refills the same storage, which autograd's saved views of the weights rely on."""
        if self.pending is not None:
            self._finish()  # the collective writes into the buffer until then
        if self.persistent or not self.gathered or self.held:
            return
        # Parameters become empty tensors (reading one is an error, never a read of freed memory).
        for param in self.params:
            param.data = self.empty
        if leave_to_readers:
            self.model_flat = torch.empty(0, dtype=self.dtype, device=self.model_flat.device)
        else:
            self.model_flat.untyped_storage().resize_(0)
        self.gathered = False

    def update_from_full(self) -> None:
        """After a gathered parameter was modified in place: take this rank's shard from the full buffer."""
        if self.routes is not None:
            self.routes.weights_changed(self)
        lo, hi = self.layout.shard_range(self.shard_rank)
        values = self.model_flat[lo:hi]
        self.home.store(values)
        if self.master_writer is not None:
            self.master_writer(self, values)
        elif self.separate_master:
            self.master.copy_(values)

    def store_whole(self, param: torch.nn.Parameter, value: torch.Tensor) -> None:
        """Set one of the unit's parameters from its whole value, without a collective: this rank keeps its piece
        (every rank of the group must be given the same value, as when each reads it from one file). For units
        with no master (dszero.Init's untrained ones: a checkpoint's frozen weights); others keep their master."""
        index = next(i for i, p in enumerate(self.params) if p is param)
        slot = self.layout.slots[index]
        flat = value.detach().reshape(-1).to(self.dtype)
        if flat.numel() != slot.numel:
            raise ZeroError(f"{self.names[index]}: {flat.numel()} values given for a parameter of shape {slot.shape}")
        if self.pending is not None:
            self._finish()
        if self.gathered:
            self.model_flat[slot.offset:slot.end].copy_(flat)
        lo, hi = self.layout.shard_range(self.shard_rank)
        first, last = max(lo, slot.offset), min(hi, slot.end)
        if first < last:
            shard = self.home.fetch().clone()
            self.home.done()
            shard[first - lo:last - lo].copy_(flat[first - slot.offset:last - slot.offset])
            self.home.store(shard)
        if self.routes is not None:
            self.routes.weights_changed(self)

    def master_to_model(self) -> None:
        """Copy the updated master shard into the parameter shard (refresh() then re-gathers kept units)."""
        if self.separate_master:
            self.home.store(self.master)

    def refresh(self) -> None:
        """Re-gather a unit that stays gathered (persistent), so it shows the updated weights."""
        if self.start_refresh():
            self.gather()

    def start_refresh(self) -> bool:
        """Launch refresh()'s re-gather and return (the next gather() waits for it), so the refreshes of many
        units travel together; False when the unit is not gathered (nothing to refresh). A shard read from NVMe
        is re-gathered at once: its read buffers are few, and prefetching must not take the last one."""
        if self.routes is not None:
            self.routes.weights_changed(self)
        if not self.gathered:
            return False
        if self.pending is not None:
            self._finish()
        self.gathered = False
        self._start(async_op=getattr(self.home, "spare_buffers", None) is None)
        return True

    def gathered_bytes(self) -> int:
        return self.model_flat.numel() * self.model_flat.element_size() if self.gathered else 0


class _HomeRelease:
    """An async gather's handles; the shard's fetched copy goes back to its home once they are done."""

    def __init__(self, handle: Any, home: Any):
        self.handle, self.home = handle, home

    def wait(self) -> None:
        if self.handle is not None:
            self.handle.wait()
            self.handle = None
            self.home.done()


def full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The shape a parameter has when gathered (it is empty while partitioned)."""
    unit = getattr(param, "_dszero_unit", None)
    return tuple(param.ds_shape) if unit is not None else tuple(param.shape)


def full_numel(param: torch.Tensor) -> int:
    return math.prod(full_shape(param))


def copy_full_value(param: torch.Tensor, target: torch.Tensor) -> None:
    """Copy a parameter's whole value into `target`, gathering it first if it is partitioned (dszero.Init)."""
    unit = getattr(param, "_dszero_unit", None)
    if unit is None:
        target.copy_(param.data)
        return
    was = unit.gathered
    unit.gather()
    target.copy_(param.data)
    if not was:
        unit.release()


def modules_reading(module: torch.nn.Module) -> list[tuple[torch.nn.Module, list[torch.nn.Parameter]]]:
    """(submodule, the parameters its forward reads) for every submodule whose forward is gathered for:
    its own parameters, or a fused module's and all its children's (the children are then left out)."""
    covered: set[int] = set()
    fused: dict[int, list[torch.nn.Parameter]] = {}
    for submodule in module.modules():
        if id(submodule) in covered:
            continue
        if gathered_whole(submodule):
            # Its forward reads its children's weights without calling them (or calls them in an order that
            # varies, a leaf): one unit for all.
            fused[id(submodule)] = list(submodule.parameters())
            if z3_leaf_module(submodule):
                for p in fused[id(submodule)]:
                    p.ds_z3_leaf_module = submodule  # DeepSpeed's mark (z3_leaf_parameter)
            covered.update(id(m) for m in submodule.modules() if m is not submodule)
    return [(submodule, fused.get(id(submodule)) or list(submodule.parameters(recurse=False)))
            for submodule in module.modules() if id(submodule) not in covered]


def partition_units(module: torch.nn.Module, optimizer: torch.optim.Optimizer, group: Any, master_dtype: torch.dtype,
                    persistence_threshold: int, homes: Any = None, master_device: torch.device | None = None,
                    pin_master: bool = False, own_master: bool = False,
                    group_settings: list[dict[str, Any]] | None = None) -> list[Unit]:
    """Every trainable parameter of `optimizer` in a unit of the first module that reads it, one unit per
    module and optimizer group, in module order (every rank builds the same units in the same order:
    each broadcasts rank 0's weights). Units under `persistence_threshold` elements stay gathered. The
    optimizer's groups are rebound to the units' master shards; the units are returned in that order,
    which is how the optimizer's state_dict numbers them. Parameters dszero.Init partitioned that the
    optimizer does not train (frozen ones: LoRA's base weights) keep Init's units (`untrained_units`).

    group_settings: per optimizer group, the process group its units are partitioned over ("group",
    default `group`) and what their summed gradients are divided by ("average_over", default that
    group's size): experts over their expert-data group, divided by the data-parallel size."""
    names = {id(p): n for n, p in module.named_parameters()}
    group_of = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"] if p.requires_grad}
    unit_of_param: dict[int, Unit] = {}
    per_group: list[list[Unit]] = [[] for _ in optimizer.param_groups]
    for submodule, candidates in modules_reading(module):
        own = [p for p in candidates if id(p) in group_of and id(p) not in unit_of_param]
        for index in sorted({group_of[id(p)] for p in own}):
            params = [p for p in own if group_of[id(p)] == index]
            numel = sum(full_numel(p) for p in params)
            settings = group_settings[index] if group_settings else {}
            unit_group = settings.get("group", group)
            unit = Unit(submodule, params, [names[id(p)] for p in params], dist.get_world_size(unit_group),
                        dist.get_rank(unit_group), master_dtype, numel < persistence_threshold, unit_group, homes,
                        master_device, pin_master, own_master)
            unit.average_over = settings.get("average_over")
            per_group[index].append(unit)
            for p in params:
                unit_of_param[id(p)] = unit
    for index, units in enumerate(per_group):
        optimizer.param_groups[index]["params"] = [u.master_param for u in units]
    return [unit for units in per_group for unit in units]


def untrained_units(module: torch.nn.Module) -> list[Unit]:
    """dszero.Init's units that no optimizer took over (frozen parameters, or ones not given to the optimizer),
    each once, in module order: stage 3 gathers them for forward and backward like the others, but they get no
    gradient reduction, optimizer state or master copy."""
    found: dict[int, Unit] = {}
    for param in module.parameters():
        unit = getattr(param, "_dszero_unit", None)
        if unit is not None and unit.partition_only:
            found.setdefault(id(unit), unit)
    return list(found.values())


class GatheredParameters:
    """Gather stage-3 parameters for reading (or, with modifier_rank, writing) outside forward/backward.

        with dszero.GatheredParameters(model.parameters()):
            torch.save(model.state_dict(), path)          # every rank sees the whole weights
        with dszero.GatheredParameters(model.head.weight, modifier_rank=0):
            if rank == 0: model.head.weight.zero_()       # rank 0's change reaches every shard

    Collective: every rank of the data-parallel group enters it with the same parameters. Parameters
    that are not partitioned (stages 0-2, or not under ZeRO) pass through untouched.
    """

    def __init__(self, params: Any, modifier_rank: int | None = None, fwd_module: Any = None, enabled: bool = True):
        if isinstance(params, torch.Tensor):
            params = [params]
        units: dict[int, Unit] = {}
        for param in params:
            unit = getattr(param, "_dszero_unit", None)
            if unit is not None:
                units.setdefault(id(unit), unit)
        self.units = list(units.values()) if enabled else []
        self.modifier_rank = modifier_rank
        self.was_gathered: list[bool] = []

    def __enter__(self) -> GatheredParameters:
        self.was_gathered = [unit.gathered for unit in self.units]
        for unit in self.units:
            unit.gather()
        return self

    def __exit__(self, *exc: Any) -> None:
        for unit, was in zip(self.units, self.was_gathered):
            if self.modifier_rank is not None:
                src = dist.get_global_rank(unit.group, self.modifier_rank) if unit.group is not None else self.modifier_rank
                if dist.get_world_size(unit.group) > 1:
                    dscomm.broadcast(unit.model_flat, src, group=unit.group, log_name="zero3_modified_params")
                unit.update_from_full()
            if not was:
                unit.release(leave_to_readers=True)
