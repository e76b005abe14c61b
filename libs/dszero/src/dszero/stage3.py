"""Stage 3: parameters partitioned too, gathered module by module when they are needed.

Each module's own parameters (per optimizer group) form a unit with its own flat buffer, split
evenly over the ranks. A rank keeps only its shard; the full buffer's storage is allocated by an
all-gather just before the module runs (forward pre-hook, backward pre-hook) and freed right after
(forward post-hook; once its gradients are reduced in backward). Units smaller than
`stage3_param_persistence_threshold` elements stay gathered. Gradients are reduce-scattered unit
by unit during backward, launched in a fixed order so every rank issues the same collectives.
After the first step the next units are gathered asynchronously while the current one computes
(`stage3_prefetch_bucket_size`, see prefetch.py). `stage3_max_live_parameters` bounds every gathered
partitioned unit, prefetched, kept for reuse or gathered on demand: prefetching stops at it, and an
on-demand gather first releases units gathered ahead of their use to stay under it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.distributed as dist

import dscomm

from .errors import ZeroError
from .layout import GroupLayout
from .offload.param_homes import DeviceHome
from .offload.pinned import host_copy
from .ordered import InOrderLauncher, weakly
from .prefetch import ABSENT, BUSY, KEPT, PrefetchPlan
from .reuse import ReusePolicy
from .status import ZeroParamStatus, next_param_id
from .wire import gather_shards, reduce_scatter

# The embedding's input (token ids) never requires grad, so torch notes that its backward pre-hook
# fires on output gradients; that is exactly what stage 3 wants, so the note is noise here.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect "
                                          "to module outputs since no inputs require gradients")

# Modules whose forward uses their children's parameters directly (not by calling the children).
FUSED_MODULES: tuple[type, ...] = (torch.nn.MultiheadAttention,)


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

    def release(self) -> None:
        if self.pending is not None:
            self._finish()  # the collective writes into the buffer until then
        if self.persistent or not self.gathered or self.held:
            return
        # Parameters become empty tensors (reading one is an error, never a read of freed memory),
        # and the buffer's memory goes back to the allocator.
        for param in self.params:
            param.data = self.empty
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

    def master_to_model(self) -> None:
        """Copy the updated master shard into the parameter shard (refresh() then re-gathers kept units)."""
        if self.separate_master:
            self.home.store(self.master)

    def refresh(self) -> None:
        """Re-gather a unit that stays gathered (persistent), so it shows the updated weights."""
        if self.routes is not None:
            self.routes.weights_changed(self)
        if self.gathered:
            if self.pending is not None:
                self._finish()
            self.gathered = False
            self.gather()

    def gathered_bytes(self) -> int:
        return self.model_flat.numel() * self.model_flat.element_size() if self.gathered else 0


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


class Stage3:
    """The hooks that gather, release and reduce, and the units they act on."""

    routes: Any = None  # ZeRO++ (zeropp/): how gradients are reduced; None: the plain reduce-scatter

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, group: Any, master_dtype,
                 persistence_threshold: int, average: bool, homes: Any = None, reuse: ReusePolicy | None = None,
                 master_device: torch.device | None = None, pin_master: bool = False, own_master: bool = False,
                 prefetch: PrefetchPlan | None = None, grad_dtype: torch.dtype | None = None,
                 wire_dtype: torch.dtype | None = None, group_settings: list[dict[str, Any]] | None = None):
        """grad_dtype: what each unit's gradient shard accumulates in (None: the model's dtype); wire_dtype:
        what gradients are reduce-scattered in (communication_data_type; None: the model's dtype);
        group_settings: per optimizer group, the process group its units are partitioned and reduced over
        ("group", default `group`) and what their summed gradients are divided by ("average_over", default
        that group's size): experts over their expert-data group, divided by the data-parallel size."""
        self.group = group
        self.grad_dtype = grad_dtype
        self.wire_dtype = wire_dtype
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.average = average
        self.persistence_threshold = persistence_threshold
        self.reuse = reuse or ReusePolicy(0, 0)
        self.prefetch = prefetch or PrefetchPlan(0)
        # NVMe-homed shards start reading one bucket beyond the gathers (a second plan, twice as far).
        nvme = getattr(homes, "device", "none") == "nvme"
        self.read_ahead = PrefetchPlan(2 * self.prefetch.bucket) if nvme else None
        self.in_forward: set[int] = set()  # units whose module's forward is running
        self.in_backward: set[int] = set()  # units gathered for a backward whose gradients are not reduced yet
        names = {id(p): n for n, p in module.named_parameters()}
        group_of = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"] if p.requires_grad}
        self.units: list[Unit] = []
        self.live = [0]  # elements of partitioned units gathered now, kept by the units themselves (Unit.tally)
        self.units_of_module: dict[int, list[Unit]] = {}
        self.unit_of_param: dict[int, Unit] = {}
        per_group: list[list[Unit]] = [[] for _ in optimizer.param_groups]
        covered: set[int] = set()
        fused_members: dict[int, list[torch.nn.Parameter]] = {}
        for submodule in module.modules():
            if id(submodule) in covered:
                continue
            if isinstance(submodule, FUSED_MODULES):
                # Its forward reads its children's weights without calling them: one unit for all.
                fused_members[id(submodule)] = list(submodule.parameters())
                covered.update(id(m) for m in submodule.modules() if m is not submodule)
        for submodule in module.modules():
            if id(submodule) in covered:
                continue
            candidates = fused_members.get(id(submodule)) or list(submodule.parameters(recurse=False))
            own = [p for p in candidates if id(p) in group_of and id(p) not in self.unit_of_param]
            for index in sorted({group_of[id(p)] for p in own}):
                params = [p for p in own if group_of[id(p)] == index]
                numel = sum(full_numel(p) for p in params)
                settings = (group_settings or {})[index] if group_settings else {}
                unit_group = settings.get("group", group)
                unit = Unit(submodule, params, [names[id(p)] for p in params], dist.get_world_size(unit_group),
                            dist.get_rank(unit_group), master_dtype, numel < persistence_threshold, unit_group,
                            homes, master_device, pin_master, own_master)
                unit.average_over = settings.get("average_over")
                if grad_dtype not in (None, unit.dtype):
                    unit.grad_shard = unit.grad_shard.to(grad_dtype)
                unit.tally = self.live  # from here on its gathers and releases are counted
                self.live[0] += unit.layout.padded_numel if unit.gathered and not unit.persistent else 0
                self.units.append(unit)
                per_group[index].append(unit)
                for p in params:
                    self.unit_of_param[id(p)] = unit
        for submodule in module.modules():
            if id(submodule) in covered:
                continue
            params = fused_members.get(id(submodule)) or list(submodule.parameters(recurse=False))
            used = {id(self.unit_of_param[id(p)]): self.unit_of_param[id(p)]
                    for p in params if id(p) in self.unit_of_param}
            if used:
                self.units_of_module[id(submodule)] = list(used.values())
                submodule.register_forward_pre_hook(self._before_forward)
                submodule.register_forward_hook(self._after_forward)
                submodule.register_full_backward_pre_hook(self._before_backward)
        left_out = [n for n, p in module.named_parameters()
                    if getattr(getattr(p, "_dszero_unit", None), "partition_only", False)]
        if left_out:
            raise ZeroError(f"{len(left_out)} parameter(s) partitioned by dszero.Init are not trainable parameters "
                            f"of the optimizer (first: {left_out[0]}); give the optimizer every parameter built "
                            f"inside dszero.Init, or build the untrained ones outside it")
        for index, units in enumerate(per_group):
            optimizer.param_groups[index]["params"] = [u.master_param for u in units]
        # Listed as the optimizer enumerates its parameters, which is how its state_dict numbers them.
        self.units = [unit for units in per_group for unit in units]
        self.order = list(reversed(self.units))  # gradients arrive last layer first
        self.unit_by_key = {id(u): u for u in self.units}
        self.launcher = InOrderLauncher([len(u.params) for u in self.order], lambda i: self._reduce(self.order[i]),
                                        self._release_all)
        for position, unit in enumerate(self.order):
            for index, param in enumerate(unit.params):
                param.register_post_accumulate_grad_hook(self._grad_hook(position, index))

    # ------------------------------------------------------------------ hooks
    def _need(self, module, forward: bool) -> None:
        units = self.units_of_module[id(module)]
        for unit in units:
            if not unit.persistent:
                self.reuse.on_gather(id(unit), unit.layout.padded_numel)
                self.prefetch.on_need(id(unit), unit.layout.padded_numel, forward)
                if self.read_ahead is not None:
                    self.read_ahead.on_need(id(unit), unit.layout.padded_numel, forward)
        self._make_room(units)
        for unit in units:
            unit.gather(compute=True)
        self._gather_ahead()

    # ------------------------------------------------------------------ stage3_max_live_parameters
    def live_numel(self) -> int:
        """Elements of partitioned units gathered now (in flight included): what max_live_parameters bounds."""
        return self.live[0]

    def _make_room(self, needed: list[Unit]) -> None:
        """Before an on-demand gather: release units gathered ahead of their use (kept for reuse first, then
        prefetched, latest first) until the needed ones fit under max_live_parameters. Units a running
        forward or a pending backward reads are never released; the needed ones are gathered regardless."""
        missing = sum(u.layout.padded_numel for u in needed if not u.gathered and not u.persistent)
        live = self.live_numel()
        if live + missing <= self.reuse.max_live:
            return
        busy = self.in_forward | self.in_backward | {id(u) for u in needed}
        kept = [key for key in self.reuse.live if key not in busy]
        ahead = [key for key in reversed(self.prefetch.in_flight) if key not in busy and key not in kept]
        for key in kept + ahead:
            unit = self.unit_by_key[key]
            if not unit.gathered or unit.persistent:
                continue
            unit.release()
            self.reuse.released(key)
            live -= unit.layout.padded_numel
            if live + missing <= self.reuse.max_live:
                return

    def _state(self, key: int) -> int:
        unit = self.unit_by_key[key]
        if not unit.gathered:
            return ABSENT
        return BUSY if key in self.in_forward else KEPT

    def _gather_ahead(self) -> None:
        """Launch the next units' gathers (see prefetch.py); NVMe shards further on start reading."""
        live = self.live_numel()
        for key in self.prefetch.ahead(self._state):
            unit = self.unit_by_key[key]
            if live + unit.layout.padded_numel > self.reuse.max_live:
                break  # max_live_parameters bounds what is gathered ahead too; the rest is gathered on demand
            if not unit.gathered and self._spare_read_buffer(unit):
                unit.gather_async()
                live += unit.layout.padded_numel
        if self.read_ahead is not None:
            for key in self.read_ahead.ahead(self._state):
                unit = self.unit_by_key[key]
                read = getattr(unit.home, "prefetch", None)  # CPU-homed shards (max_in_cpu) need no read
                if read is not None and not unit.gathered and self._spare_read_buffer(unit):
                    read()

    @staticmethod
    def _spare_read_buffer(unit: Unit) -> bool:
        # An NVMe shard needs a read buffer: prefetching never takes the last one, which an on-demand gather needs.
        spare = getattr(unit.home, "spare_buffers", None)
        return spare is None or spare() > 1

    def _held(self, module) -> bool:
        # Gathered by HeldParameters for a block of forwards (generation): no gather, release or bookkeeping
        # here, so the step's prefetch and reuse plans never see those forwards.
        return all(unit.held for unit in self.units_of_module[id(module)])

    def _before_forward(self, module, args):
        if self._held(module):
            return
        self.in_forward.update(id(u) for u in self.units_of_module[id(module)])
        self._need(module, True)

    def _after_forward(self, module, args, output):
        if self._held(module):
            return
        # Released now unless reused soon; the backward pre-hook gathers them again before autograd reads them.
        for unit in self.units_of_module[id(module)]:
            self.in_forward.discard(id(unit))
            if unit.persistent or self.reuse.keep_after_forward(id(unit), unit.layout.padded_numel,
                                                                  live_numel=self.live_numel()):
                continue
            unit.release()

    def _before_backward(self, module, grad_output):
        if self._held(module):
            raise ZeroError("a backward ran through parameters held gathered by HeldParameters (generation runs "
                            "without gradients); leave the block before training")
        self._need(module, False)
        self.in_backward.update(id(u) for u in self.units_of_module[id(module)])

    def _grad_hook(self, position: int, index: int):
        mark = weakly(self.launcher.mark_ready)  # weak: see ordered.weakly
        def hook(param):
            mark(position, index)
        return hook

    def _release_all(self) -> None:
        for unit in self.units:
            unit.release()
        self.reuse.end_of_step()
        self.prefetch.end_of_step()
        if self.read_ahead is not None:
            self.read_ahead.end_of_step()
        self.in_forward.clear()
        self.in_backward.clear()

    def _reduce(self, unit: Unit) -> None:
        # Gradients are cast into the wire dtype as they are copied, and into the shard's as they are added.
        flat = torch.zeros(unit.layout.padded_numel, dtype=self.wire_dtype or unit.dtype, device=unit.grad_shard.device)
        for param, slot in zip(unit.params, unit.layout.slots):
            if param.grad is not None:
                flat[slot.offset:slot.end].copy_(param.grad.reshape(-1))
                param.grad = None
        world = unit.layout.world_size
        divisor = (unit.average_over or world) if self.average else 1
        averaged = self.average and divisor == world  # the collective averages over its own ranks
        if world > 1:
            out = torch.empty(unit.grad_shard.numel(), dtype=flat.dtype, device=flat.device)
            if self.routes is not None and unit.group is self.group:  # ZeRO++ routes over the data-parallel group
                flat = self.routes.reduce_scatter(unit, out, flat, average=averaged)
            else:
                flat = reduce_scatter(out, flat, unit.group, average=averaged, log_name="zero3_reduce_scatter")
        if divisor != 1 and not averaged:  # experts: summed over their group, divided by the data-parallel size
            flat.div_(divisor)
        unit.grad_shard.add_(flat)
        unit.release()
        self.reuse.released(id(unit))
        self.in_backward.discard(id(unit))

    # ------------------------------------------------------------------ for the optimizer
    def grad_shards(self) -> list[torch.Tensor]:
        return [u.grad_shard for u in self.units]

    def zero(self) -> None:
        for unit in self.units:
            unit.grad_shard.zero_()
            for param in unit.params:
                param.grad = None

    def reduce(self) -> list[torch.Tensor]:
        return self.grad_shards()

    def set_sync(self, enabled: bool) -> None:
        pass  # ZeroOptimizer refuses sync off at stage 3: each unit is reduced as its backward runs

    def finish_backward(self) -> None:
        pass  # nothing is left in flight: each unit's reduce-scatter completes in its hook

    def buffer_bytes(self) -> int:
        return sum(u.grad_shard.numel() * u.grad_shard.element_size() for u in self.units)

    def comm_buffer_bytes(self) -> int:
        held = self.routes.buffer_bytes() if self.routes is not None else 0  # ZeRO++'s secondary copies
        return held + sum(u.gathered_bytes() for u in self.units)


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
                unit.release()
