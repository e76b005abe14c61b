"""The compiled-ZeRO runtime: what the ops in a compiled graph do, through dszero's `CompilerControls`.

One runtime per ZeRO optimizer. It holds the parameter and unit tables the passes see, follows the
schedule (switching entries at their steps, after a profiling run when the new passes need one, and
applying selective gather's choice), keeps stage-3 parameters shaped as torch.compile traced them while a
compiled forward runs (see `forward_window`), and counts what its ops did (`stats`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

import dscomm
from dsconfig import CompileConfig
from dszero import CompilerControls

from . import ops
from .errors import DeepCompileError
from .fallback import EagerGather
from .graphinfo import Budgets, GraphInfo, ParamSlot, Profile, UnitSlot
from .memory import profile_memory
from .passes import choose_kept_units, keep_budget
from .profiling import InputStore, time_graph
from .reuse import ForwardReuse
from .schedule import Entry, default_schedule, entry_at, names_in, validate_schedule

logger = logging.getLogger("dscompile")

# Passes that plan with node times, so switching to an entry that has one starts with a profiling run.
_TIMED = {"offload_activation", "offload_adam_states"}


class DeepCompileRuntime:
    def __init__(self, zero: Any, settings: CompileConfig | None = None, *, schedule: Any = None,
                 step: Callable[[], int] | None = None, budgets: Budgets | None = None):
        self.settings = settings or CompileConfig(deepcompile=True)
        self.controls = CompilerControls(zero)
        self.stage = self.controls.stage
        if self.stage not in (1, 2, 3):
            raise DeepCompileError(f"DeepCompile schedules ZeRO stages 1, 2 and 3; zero_optimization.stage is "
                                   f"{self.stage}")
        self.schedule: list[Entry] = (validate_schedule(schedule, self.stage) if schedule is not None
                                      else default_schedule(self.stage, self.settings))
        if self.settings.offload_activation and "offload_activation" not in names_in(self.schedule):
            logger.warning("compile.offload_activation has no effect: the reference runs activation offload only "
                           "from a custom schedule that names the pass, e.g. engine.compile(schedule=[(0, "
                           "['zero3_compile', 'offload_activation'])])")
        self.group = getattr(zero, "process_group", None)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.backward_count = 0
        self.optimizer_steps = 0
        if step is None:  # the wrapped torch optimizer's steps, as the engine's global_steps would count them
            self._step_hook = zero.optimizer.register_step_post_hook(self._count_step)
        self.step_source = step or (lambda: self.optimizer_steps)
        self.params = self.controls.params()
        self.units = self.controls.units()
        names = {id(p): n for n, p in zero.module.named_parameters()}
        unit_key = {id(u): k for k, u in enumerate(self.units)}
        self.slots: dict[int, ParamSlot] = {}
        for key, param in enumerate(self.params):
            unit = self.controls.unit_of(param)
            shape = tuple(getattr(param, "ds_shape", param.shape)) if unit is not None else tuple(param.shape)
            if unit is None:
                self.slots[id(param)] = ParamSlot(key, names.get(id(param), f"param{key}"), shape)
                continue
            index = next(i for i, p in enumerate(unit.params) if p is param)
            self.slots[id(param)] = ParamSlot(key, names.get(id(param), f"param{key}"), shape, unit_key[id(unit)],
                                              unit.layout.slots[index].offset, unit.persistent)
        self.unit_slots = {k: UnitSlot(k, u.layout.padded_numel, u.dtype) for k, u in enumerate(self.units)}
        self.budgets = budgets or self._budgets(zero)
        if self.stage == 2:
            self.controls.set_overlap(self.settings.double_buffer)
        if (self.settings.offload_parameters and not self.controls.shards_can_move(self.units)
                and any(p.device.type != "cpu" for p in self.params)):
            raise DeepCompileError("compile.offload_parameters: the parameter shards are the optimizer's master "
                                   "weights too (same dtype, no optimizer offload), so they cannot leave the "
                                   "device; use bf16/fp16 training or zero_optimization.offload_optimizer")
        self.id = ops.register_runtime(self)
        self.stats: Counter[str] = Counter()
        self.pending: dict[int, tuple[Any, float, int]] = {}
        self.live_gathered = self.peak_gathered = self.ahead = self.peak_ahead = 0
        self.reuse = ForwardReuse(self.budgets.reuse_bytes, self.budgets.live_bytes)
        self.step_gathers: Counter[int] = Counter()  # collectives gathering each unit in the step running now
        self.last_step_gathers: Counter[int] = Counter()  # ... in the last whole optimizer step
        self.gathers_step = 0  # the optimizer step step_gathers counts
        self.kept_units: frozenset[int] = frozenset()
        self.kept_bytes = 0  # of the kept units: stage3_max_live_parameters counts them as gathered
        self.entry_index = 0
        self.epoch = 0
        self.profile = Profile()
        self.inputs = InputStore(self.settings.keep_int_input_tensors, self.settings.keep_all_input_tensors)
        self.graphs: dict[int, tuple[torch.fx.GraphModule, GraphInfo]] = {}  # this entry's graphs, after passes
        self.profiling = False
        self.hollow: dict[int, torch.Tensor] = {}
        self.window_depth = 0
        self.end_queued = False
        self.states_offloaded = False
        self.closed = False
        self.eager_gather = EagerGather(self)
        self.module: torch.nn.Module | None = None  # what deepcompile() compiled
        self.fell_back: str | None = None  # why compiling failed, when the module runs as eager ZeRO instead

    def _count_step(self, *args: Any) -> None:
        self.optimizer_steps += 1

    # ------------------------------------------------------------------ what the passes see
    @staticmethod
    def _budgets_from_numbers(prefetch_numel: int, live_numel: int, itemsize: int, settings: CompileConfig,
                              reuse_numel: int = 1 << 62) -> Budgets:
        return Budgets(prefetch_bytes=int(prefetch_numel) * itemsize, live_bytes=int(live_numel) * itemsize,
                       reuse_bytes=int(reuse_numel) * itemsize,
                       gathers_ahead=2 if settings.double_buffer else 1,
                       free_activation_bytes=settings.free_activation_threshold)

    def _budgets(self, zero: Any) -> Budgets:
        config = zero.config
        itemsize = self.params[0].dtype.itemsize if self.params else 4
        return self._budgets_from_numbers(config.stage3_prefetch_bucket_size, config.stage3_max_live_parameters,
                                          itemsize, self.settings, config.stage3_max_reuse_distance)

    def passes_now(self) -> tuple[Any, ...]:
        return self.schedule[self.entry_index][1]

    def graph_info(self, kind: str, graph_id: int) -> GraphInfo:
        return GraphInfo(kind=kind, runtime=self.id, stage=self.stage, graph_id=graph_id, units=self.unit_slots,
                         budgets=self.budgets, profile=self.profile, kept_units=self.kept_units)

    def slot_of(self, tensor: Any) -> ParamSlot | None:
        slot = self.slots.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
        if slot is not None and slot.unit is not None and self.units[slot.unit].persistent:
            return ParamSlot(slot.key, slot.name, slot.shape, slot.unit, slot.offset, True)
        return slot

    def keep_graph(self, graph_id: int, module: torch.fx.GraphModule, info: GraphInfo) -> None:
        self.graphs[graph_id] = (module, info)

    # ------------------------------------------------------------------ the forward window (stage 3)
    @contextlib.contextmanager
    def forward_window(self) -> Iterator[None]:
        """While a compiled forward runs, a released parameter holds a hollow tensor of its whole shape (no
        memory: torch.compile's guards see the shape it traced; the graph gathers the values itself); after
        it, the empty tensor eager ZeRO leaves there, so a stray read is an error, not a read of nothing."""
        self.advance_schedule()
        if self.stage != 3:
            yield
            return
        self.window_depth += 1
        if self.window_depth == 1:
            self.live_gathered -= self.reuse.start_forward(torch.is_grad_enabled())
            self.hollow_released()
        try:
            if self.window_depth == 1:
                with self.eager_gather:
                    yield
            else:
                yield
        finally:
            self.window_depth -= 1
            if self.window_depth == 0:
                self.eager_gather.release_all()
                for unit in self.units:
                    if not unit.gathered:
                        for param in unit.params:
                            param.data = unit.empty

    def hollow_released(self) -> None:
        for unit in self.units:
            if unit.gathered:
                continue
            for param in unit.params:
                hollow = self.hollow.get(id(param))
                if hollow is None:
                    hollow = torch.empty(param.ds_shape, dtype=param.dtype, device=param.device)
                    hollow.untyped_storage().resize_(0)
                    self.hollow[id(param)] = hollow
                param.data = hollow

    # ------------------------------------------------------------------ the schedule
    def advance_schedule(self) -> None:
        step = int(self.step_source())
        if step != self.gathers_step:
            self.last_step_gathers, self.step_gathers, self.gathers_step = self.step_gathers, Counter(), step
        index = entry_at(self.schedule, step)
        if index != self.entry_index:
            self.switch_to(index)

    def switch_to(self, index: int) -> None:
        passes = names_in([self.schedule[index]])
        if passes & _TIMED:
            self._profiling_run()
        self._sync_gather_times()
        if "selective_gather" in passes:
            self._apply_selective_gather()
        self.entry_index = index
        self.epoch += 1
        self.graphs.clear()
        self.inputs.clear()
        self.stats["schedule_switches"] += 1
        if self.rank == 0:
            logger.info("DeepCompile: step %s, passes %s", self.schedule[index][0], list(map(str, self.passes_now())))

    def _apply_selective_gather(self) -> None:
        profiles = [profile_memory(module.graph, info) for module, info in self.graphs.values()]
        at_once = max((p.max_gathered for p in profiles), default=0)
        kept_now = sum(self.unit_slots[k].nbytes for k in self.kept_units)
        # The graphs' peak with nothing kept: a kept unit, gathered again where it is read, adds at most its bytes.
        graph_peak = max((p.max_peak for p in profiles), default=0) + kept_now
        if profiles and self.budgets.peak_bytes is None:
            self.budgets = dataclasses.replace(self.budgets, peak_bytes=keep_budget(
                graph_peak, self._resident_bytes(kept_now), self.budgets.keep_margin))
        headroom = None
        if self.params and self.params[0].device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.params[0].device)
            headroom = int(self._min_over_ranks(float(free)) * 0.9)
        candidates = {k: u for k, u in self.unit_slots.items() if not self.units[k].persistent or k in self.kept_units}
        if self.last_step_gathers:
            # Keeping a unit saves its gathers but costs a refresh after each step: one gathered once a step (read
            # in forward and kept for backward) saves nothing, and would hold its memory through the step.
            candidates = {k: u for k, u in candidates.items() if k in self.kept_units or self.last_step_gathers[k] > 1}
        kept = choose_kept_units(candidates, at_once, self.budgets, self.profile, headroom,
                                 graph_peak if profiles else None)
        for key in sorted(set(self.kept_units) - kept):
            self.controls.keep_gathered(self.units[key], False)
        for key in sorted(kept - set(self.kept_units)):
            self.controls.keep_gathered(self.units[key], True)
        self.kept_units = kept
        self.kept_bytes = sum(self.unit_slots[k].nbytes for k in kept)
        self.stats["kept_units"] = len(kept)
        self.stats["kept_bytes"] = self.kept_bytes
        self.stats["keep_budget_bytes"] = (self.budgets.peak_bytes or 0) - graph_peak if profiles else 0

    def _resident_bytes(self, kept_bytes: int) -> int:
        """What this rank holds across steps (parameter shards, gradients, master weights, optimizer states:
        dszero's memory report), without units kept gathered; every rank takes the largest, so all choose alike."""
        report = getattr(self.controls.zero, "memory_report", None)
        held = max(report()["device_bytes"] - kept_bytes, 0) if report is not None else 0
        return int(-self._min_over_ranks(-float(held)))

    def _profiling_run(self) -> None:
        self.profiling = True
        try:
            for graph_id in sorted(self.graphs):
                inputs = self.inputs.inputs(graph_id)
                if inputs is None:
                    continue
                module, _info = self.graphs[graph_id]
                self.profile.node_seconds[graph_id] = time_graph(module, inputs)
                self.stats["profiled_graphs"] += 1
        finally:
            self.profiling = False
        # Every rank plans with the slowest rank's times, so every rank makes the same choices.
        keys = [(g, n) for g in sorted(self.profile.node_seconds) for n in sorted(self.profile.node_seconds[g])]
        if keys and self._world() > 1:
            values = torch.tensor([self.profile.node_seconds[g][n] for g, n in keys], dtype=torch.float64)
            dscomm.all_reduce(values, op=dscomm.ReduceOp.MAX, group=self.group, log_name="dscompile_profile")
            for (g, n), v in zip(keys, values.tolist()):
                self.profile.node_seconds[g][n] = v

    def _sync_gather_times(self) -> None:
        if not self.unit_slots or self._world() == 1:
            return
        keys = sorted(self.unit_slots)
        values = torch.tensor([self.profile.gather_seconds.get(k, -1.0) for k in keys], dtype=torch.float64)
        dscomm.all_reduce(values, op=dscomm.ReduceOp.MAX, group=self.group, log_name="dscompile_profile")
        self.profile.gather_seconds = {k: v for k, v in zip(keys, values.tolist()) if v >= 0}
        extra = torch.tensor([self.profile.copy_bytes_per_second, -self.profile.state_reload_seconds],
                             dtype=torch.float64)
        dscomm.all_reduce(extra, op=dscomm.ReduceOp.MIN, group=self.group, log_name="dscompile_profile")
        self.profile.copy_bytes_per_second, self.profile.state_reload_seconds = extra[0].item(), -extra[1].item()

    def _world(self) -> int:
        return dist.get_world_size(self.group) if dist.is_initialized() else 1

    def _min_over_ranks(self, value: float) -> float:
        if self._world() == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        dscomm.all_reduce(tensor, op=dscomm.ReduceOp.MIN, group=self.group, log_name="dscompile_profile")
        return tensor.item()

    # ------------------------------------------------------------------ the ops
    def _sync(self, key: str) -> None:
        if not getattr(self.settings, f"sync_{key}"):
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if key.endswith("allgather"):
            for unit in list(self.pending):
                self._complete_gather(unit)
        else:
            self.controls.finish_reductions()

    def op_gather(self, unit_key: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        size = numel * dtype.itemsize
        if not self.profiling:
            kept = self.reuse.on_gather(unit_key, size)
            if kept is not None:  # the forward left it gathered for this backward: no collective
                self.stats["reused"] += 1
                return kept
            self.live_gathered -= self.reuse.make_room(size, self.live_gathered + self.kept_bytes)
            self.step_gathers[unit_key] += 1
        self._sync("before_allgather")
        unit = self.units[unit_key]
        buffer = torch.empty(numel, dtype=dtype, device=device)
        handle = self.controls.gather_into(unit, buffer, async_op=True)
        self._note_ahead()  # what other gathers are in flight while this one starts
        self.pending[unit_key] = (handle, time.perf_counter(), size)
        self.stats["gathers"] += 1
        self.live_gathered += size
        self.ahead += size
        self.peak_gathered = max(self.peak_gathered, self.live_gathered)
        self._sync("after_allgather")
        return buffer

    def _complete_gather(self, unit_key: int) -> None:
        handle, start, size = self.pending.pop(unit_key)
        if handle is not None:
            began = time.perf_counter()
            handle.wait()
            self.stats["gather_wait_us"] += int((time.perf_counter() - began) * 1e6)
        self.ahead -= size
        if not self.profiling:
            self.profile.gather_seconds[unit_key] = time.perf_counter() - start

    def _note_ahead(self) -> None:
        """Gathers in flight while another unit's gather starts or is waited for run ahead of their use:
        what the prefetch budget bounds (peak_ahead)."""
        self.peak_ahead = max(self.peak_ahead, self.ahead)

    def op_wait_gather(self, unit_key: int, buffer: torch.Tensor) -> None:
        if unit_key in self.pending:
            self._complete_gather(unit_key)
        self._note_ahead()
        self.stats["waits"] += 1

    def op_release(self, unit_key: int, buffer: torch.Tensor) -> None:
        # The graph frees the buffer right after this op (its last use) unless the forward keeps it for backward.
        self.stats["releases"] += 1
        if not self.profiling and self.window_depth > 0 and self.reuse.on_release(
                unit_key, buffer, self.live_gathered + self.kept_bytes):
            self.stats["kept_for_backward"] += 1
            return
        self.live_gathered -= buffer.numel() * buffer.element_size()

    def op_reduce_grad(self, param_key: int, grad: torch.Tensor) -> None:
        if self.profiling:
            return
        self._queue_end_of_backward()
        self._sync("before_reduce")
        self.controls.accept_gradient(self.params[param_key], grad)
        self.stats["reduces"] += 1
        self._sync("after_reduce")

    def op_free_tensors(self, tensors: list[torch.Tensor]) -> None:
        if self.profiling:
            return
        for tensor in tensors:
            self.stats["freed_bytes"] += tensor.untyped_storage().nbytes()
            tensor.untyped_storage().resize_(0)
        self.stats["frees"] += 1

    def op_offload_tensor(self, key: int, tensor: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        pin = self.settings.offload_activation_pin_memory and tensor.device.type == "cuda"
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
        host.copy_(tensor, non_blocking=pin)
        seconds = time.perf_counter() - start
        if seconds > 0 and not self.profiling:
            self.profile.copy_bytes_per_second = host.numel() * host.element_size() / seconds
        self.stats["offloads"] += 1
        return host

    def op_reload_tensor(self, key: int, tensor: torch.Tensor) -> torch.Tensor:
        device = self.params[0].device if self.params else tensor.device
        self.stats["reloads"] += 1
        return tensor.to(device, copy=True, non_blocking=tensor.is_pinned())

    def op_offload_states(self) -> None:
        if self.profiling:
            return
        self.controls.offload_states(pin_memory=self.settings.offload_activation_pin_memory)
        self.states_offloaded = True
        self.stats["state_offloads"] += 1

    def op_reload_states(self) -> None:
        if self.profiling or not self.states_offloaded:
            return
        start = time.perf_counter()
        self.controls.reload_states()
        self.profile.state_reload_seconds = time.perf_counter() - start
        self.states_offloaded = False
        self.stats["state_reloads"] += 1

    def op_offload_param(self, unit_key: int) -> None:
        if self.controls.move_shard(self.units[unit_key], to_host=True):
            self.stats["shard_moves"] += 1
        self.stats["param_offloads"] += 1

    def op_reload_param(self, unit_key: int) -> None:
        if self.controls.move_shard(self.units[unit_key], to_host=False):
            self.stats["shard_moves"] += 1
        self.stats["param_reloads"] += 1

    def op_record_inputs(self, graph_id: int, tensors: list[torch.Tensor]) -> None:
        if not self.profiling and self.entry_index + 1 < len(self.schedule):
            self.inputs.record(graph_id, tensors)

    def _queue_end_of_backward(self) -> None:
        if not self.end_queued:
            self.end_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        self.end_queued = False
        self.backward_count += 1
        self.live_gathered -= self.reuse.drop()  # a unit the backward did not read after all
        for unit in list(self.pending):
            self._complete_gather(unit)
        if self.states_offloaded:  # a backward graph that did not bring them back: the step needs them home
            self.op_reload_states()

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """Done: anything in flight completed, states home, kept units partitioned again, and dszero's own
        hooks back, so the module trains as eager ZeRO (deepcompile's wrapper then calls it uncompiled)."""
        if self.closed:
            return
        self.closed = True
        self.controls.restore_module_hooks()
        for unit in list(self.pending):
            self._complete_gather(unit)
        self.live_gathered -= self.reuse.drop()
        if self.states_offloaded:
            self.op_reload_states()
        for key in sorted(self.kept_units):
            self.controls.keep_gathered(self.units[key], False)
        self.kept_units = frozenset()
        self.kept_bytes = 0
        hook = getattr(self, "_step_hook", None)
        if hook is not None:
            hook.remove()
        ops.unregister_runtime(self.id)
