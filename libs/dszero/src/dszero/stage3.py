"""Stage 3's schedule: when units (units.py) are gathered, released and their gradients reduced.

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

Parameters dszero.Init partitioned that the optimizer does not train (frozen: LoRA's base weights) keep
Init's units and are gathered and released by the same hooks, for forward and for backward (upstream
layers' backward reads them), but have no gradient to reduce: each is released once its module's
backward has computed the gradients of the module's inputs (a full backward hook), not at the end of
backward, so a LoRA model's frozen weights are never all gathered at once.
"""

from __future__ import annotations

import collections
import functools
import warnings
from typing import Any

import torch
import torch.distributed as dist

from . import external
from .errors import ZeroError
from .layout import Slot
from .ordered import InOrderLauncher, weakly
from .prefetch import ABSENT, BUSY, KEPT, PrefetchPlan
from .reuse import ReusePolicy
from .units import Unit, modules_reading, untrained_units
from .wire import PendingShard, start_reduce_scatter, whole_slot

# The embedding's input (token ids) never requires grad, so torch notes that its backward pre-hook
# fires on output gradients; that is exactly what stage 3 wants, so the note is noise here.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect "
                                          "to module outputs since no inputs require gradients")


# Unit reduce-scatters left running beside backward before the oldest is waited for (each holds its
# flat gradient buffer until then); two hide each one behind the next unit's backward.
REDUCTIONS_IN_FLIGHT = 2


class Stage3:
    """The hooks that gather, release and reduce, and the units they act on."""

    holds_gradients_back = False  # each unit's gradient is reduce-scattered as its backward runs
    routes: Any = None  # ZeRO++ (zeropp/): how gradients are reduced; None: the plain reduce-scatter

    def __init__(self, module: torch.nn.Module, units: list[Unit], group: Any, average: bool, homes: Any = None,
                 reuse: ReusePolicy | None = None, prefetch: PrefetchPlan | None = None,
                 grad_dtype: torch.dtype | None = None, wire_dtype: torch.dtype | None = None):
        """units: what units.partition_units cut `module` into, in the optimizer's order; grad_dtype: what each
        unit's gradient shard accumulates in (None: the model's dtype); wire_dtype: what gradients are
        reduce-scattered in (communication_data_type; None: the model's dtype)."""
        self.group = group
        self.grad_dtype = grad_dtype
        self.wire_dtype = wire_dtype
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.average = average
        self.reuse = reuse or ReusePolicy(0, 0)
        self.prefetch = prefetch or PrefetchPlan(0)
        # NVMe-homed shards start reading one bucket beyond the gathers (a second plan, twice as far).
        nvme = getattr(homes, "device", "none") == "nvme"
        self.read_ahead = PrefetchPlan(2 * self.prefetch.bucket) if nvme else None
        # Units whose module's forward is running, and how many of those forwards (an external parameter's unit
        # is read by its owner's forward and by an enclosing module's: released when the last one ends).
        self.in_forward: collections.Counter[int] = collections.Counter()
        self.forward_stack: list[torch.nn.Module] = []  # the modules whose forward is running, innermost last
        self.in_backward: set[int] = set()  # units gathered for a backward whose gradients are not reduced yet
        self.reducing: list[tuple[Unit, PendingShard, int, torch.Tensor]] = []  # in flight, oldest first
        # Flat gradient buffers whose reduction is done, reused by the next units of their size during this
        # backward (dropped at its end): fresh buffers of a layer's experts cost a page fault per 4 KiB on the
        # CPU, where no caching allocator keeps freed memory as CUDA's does.
        self.spare_flats: list[torch.Tensor] = []
        self.flat_allocations = 0  # flat gradient buffers allocated (not reused), for tests and reports
        self.units = units
        # dszero.Init's units the optimizer does not train: gathered and released by the hooks, never reduced.
        self.frozen = untrained_units(module)
        self.live = [0]  # elements of partitioned units gathered now, kept by the units themselves (Unit.tally)
        for unit in units + self.frozen:
            if grad_dtype not in (None, unit.dtype) and not unit.partition_only:
                unit.grad_shard = unit.grad_shard.to(grad_dtype)
            unit.tally = self.live  # from here on its gathers and releases are counted
            unit.scheduled = True
            self.live[0] += unit.layout.padded_numel if unit.gathered and not unit.persistent else 0
        self.unit_of_param = {id(p): unit for unit in units for p in unit.params}
        hooked_unit_of = {**{id(p): unit for unit in self.frozen for p in unit.params}, **self.unit_of_param}
        self.hooked_unit_of = hooked_unit_of
        self.root = module
        self.backward_pending: dict[int, int] = {}  # frozen unit -> backwards of its modules begun and not done
        self.units_of_module: dict[int, list[Unit]] = {}
        self.hooked_modules: list[torch.nn.Module] = []  # the modules whose hooks gather their units
        self.module_hook_handles: list[Any] = []
        self.handed: dict[int, torch.Tensor] = {}  # id(param) -> gradient handed over by accept_gradient
        module_position: dict[int, int] = {}
        for position, (submodule, params) in enumerate(modules_reading(module)):
            module_position[id(submodule)] = position
            used = {id(hooked_unit_of[id(p)]): hooked_unit_of[id(p)] for p in params if id(p) in hooked_unit_of}
            if used:
                self.units_of_module[id(submodule)] = list(used.values())
                self.hooked_modules.append(submodule)
        # Gradients arrive last layer first: units are reduced (and released) in reverse module order. Not in
        # reverse optimizer order: with several groups (AutoEP's experts, weight-decay groups) that order puts
        # every unit of one group before all of the next, and a unit waiting for the first layer's unit of an
        # earlier group would stay gathered, its full gradients held, until backward ends.
        ranked = sorted(enumerate(units), key=lambda item: (module_position.get(id(item[1].module), len(module_position)),
                                                            item[0]))
        self.order = [unit for _, unit in reversed(ranked)]
        self.unit_by_key = {id(u): u for u in self.units + self.frozen}
        frozen_keys = {id(u) for u in self.frozen}
        self.frozen_modules = [m for m in self.hooked_modules
                               if any(id(u) in frozen_keys for u in self.units_of_module[id(m)])]
        self.frozen_hook_handles: list[Any] = []  # their full backward hooks (kept apart: three per module above)
        # External parameters (external.py): every other module keeps the forward stack; the modules that read
        # another's parameters gather them with a backward pre-hook of their own.
        self.hooked_ids = {id(m) for m in self.hooked_modules}
        self.stack_modules = [m for m in module.modules() if id(m) not in self.hooked_ids]
        self.stack_hook_handles: list[Any] = []
        self.external_units: dict[int, list[Unit]] = {}  # id(module) -> the units it reads of other modules
        self.external_modules: dict[int, torch.nn.Module] = {}
        self.external_hook_handles: dict[int, Any] = {}
        self.pinned: set[int] = set()  # units found external during a forward: kept gathered until reduced
        for submodule in module.modules():
            submodule.__dict__.setdefault("_external_params", {})  # DeepSpeed's record: id(param) -> param
        self.owners = [m for m in module.modules()
                       if any(p is not None and id(p) in hooked_unit_of for p in m._parameters.values())]
        self.restore_module_hooks()
        external.track(self)
        for submodule in module.modules():
            for param in external.registered_external(submodule):
                self.add_external(submodule, param)
        names = {id(p): n for n, p in module.named_parameters()}
        self.frozen_params = [(names.get(id(p), "?"), p) for unit in self.frozen for p in unit.params]
        for name, param in self.frozen_params:
            if param.requires_grad:  # given to no optimizer, so nothing would apply its gradient
                param.register_post_accumulate_grad_hook(functools.partial(_untrained_gradient, name))
        self.launcher = InOrderLauncher([len(u.params) for u in self.order], lambda i: self._reduce(self.order[i]),
                                        self._release_all)
        self.position_of: dict[int, tuple[int, int]] = {}  # id(param) -> (position in self.order, index in unit)
        for position, unit in enumerate(self.order):
            for index, param in enumerate(unit.params):
                self.position_of[id(param)] = (position, index)
                param.register_post_accumulate_grad_hook(self._grad_hook(position, index))

    # ------------------------------------------------------------------ controls for a compiler (dscompile)
    def remove_module_hooks(self) -> None:
        """Stop gathering and releasing from module hooks (a compiled graph does it, and torch.compile breaks
        its graph at every module with a backward hook); gradients are still reduced from their hooks."""
        for handle in (self.module_hook_handles + self.frozen_hook_handles + self.stack_hook_handles
                       + list(self.external_hook_handles.values())):
            handle.remove()
        self.module_hook_handles = []
        self.frozen_hook_handles = []
        self.stack_hook_handles = []
        self.external_hook_handles = {}
        external.unwatch(self.owners)

    def restore_module_hooks(self) -> None:
        """Gather and release from module hooks again (eager ZeRO-3; the default)."""
        if self.module_hook_handles:
            return
        for submodule in self.hooked_modules:  # three per module, in this order (ZeroOptimizer.forward_hooks)
            self.module_hook_handles += [submodule.register_forward_pre_hook(_eager(self._before_forward)),
                                         submodule.register_forward_hook(_eager(self._after_forward)),
                                         submodule.register_full_backward_pre_hook(_eager(self._before_backward))]
        self.frozen_hook_handles = [submodule.register_full_backward_hook(_eager(self._after_backward))
                                    for submodule in self.frozen_modules]
        for submodule in self.stack_modules:
            self.stack_hook_handles += [submodule.register_forward_pre_hook(_eager(self._enter)),
                                        submodule.register_forward_hook(_eager(self._exit))]
        for submodule in self.external_modules.values():
            self._hook_backward(submodule)
        external.watch(self.owners, self)

    # ------------------------------------------------------------------ external parameters (external.py)
    def add_external(self, module: torch.nn.Module, param: torch.nn.Parameter) -> None:
        """`param`'s unit is gathered with `module`'s own for its forward and backward (register_external_parameter)."""
        unit = self.hooked_unit_of.get(id(param))
        if unit is not None and any(m is module for m in self.root.modules()):
            self._add_external_unit(module, unit)
            module._external_params[id(param)] = param

    def remove_external(self, module: torch.nn.Module, param: torch.nn.Parameter) -> None:
        unit = self.hooked_unit_of.get(id(param))
        units = self.external_units.get(id(module), [])
        if unit is None or unit not in units:
            return
        if any(self.hooked_unit_of.get(id(p)) is unit for p in external.registered_external(module)):
            return  # another registered parameter of the module is in the same unit
        units.remove(unit)
        self.units_of_module[id(module)].remove(unit)
        module.__dict__.get("_external_params", {}).pop(id(param), None)

    def _add_external_unit(self, module: torch.nn.Module, unit: Unit) -> bool:
        units = self.units_of_module.setdefault(id(module), [])
        if unit in units:
            return False
        units.append(unit)
        self.external_units.setdefault(id(module), []).append(unit)
        if id(module) not in self.external_modules:
            self.external_modules[id(module)] = module
            if self.module_hook_handles:
                self._hook_backward(module)
        return True

    def _hook_backward(self, module: torch.nn.Module) -> None:
        if id(module) not in self.external_hook_handles and id(module) not in self.hooked_ids:
            self.external_hook_handles[id(module)] = module.register_full_backward_pre_hook(_eager(self._before_backward))

    def read_released(self, param: torch.nn.Parameter) -> None:
        """A forward read a released partitioned parameter outside its module's forward: gather it now, and
        from now on with the innermost module whose forward runs. This step's backward pre-hook of that module
        was set up when its forward began, so the unit stays gathered until its gradients are reduced."""
        unit = self.hooked_unit_of.get(id(param))
        if not self.forward_stack or unit is None or unit.gathered or unit.held:
            return
        reader = self.forward_stack[-1]
        self._add_external_unit(reader, unit)
        reader._external_params[id(param)] = param
        self.in_forward[id(unit)] += 1  # as the reader's pre-hook would have counted it
        self._make_room([unit])
        unit.gather(compute=True)
        self._pin(unit)

    def _pin(self, unit: Unit) -> None:
        if torch.is_grad_enabled():  # this step's backward pre-hooks were set up without it
            self.pinned.add(id(unit))
            self.in_backward.add(id(unit))

    def _hand_up_returned(self, module: torch.nn.Module, output: Any) -> None:
        """`module` returned partitioned parameters (its own, or ones handed up to it): they are the caller's
        now, kept gathered until the caller's forward ends and gathered with it from then on."""
        if len(self.forward_stack) < 2 or self.forward_stack[-1] is not module:
            return
        caller = self.forward_stack[-2]
        candidates = [p for unit in self.units_of_module.get(id(module), ()) for p in unit.params]
        for param in _returned_parameters(output, candidates):
            unit = self.hooked_unit_of.get(id(param))
            if unit is None or not unit.gathered or any(id(param) in m.__dict__.get("_external_params", {})
                                                        for m in self.forward_stack[:-1]):
                continue  # an enclosing forward holds it already (gathered with that module's own units)
            caller_holds = unit in self.units_of_module.get(id(caller), ())  # another parameter of the unit
            if unit in self.external_units.get(id(module), []):  # handed up through `module`: it only passed it on
                self.external_units[id(module)].remove(unit)
                self.units_of_module[id(module)].remove(unit)
                module._external_params.pop(id(param), None)
                if caller_holds:
                    self.in_forward[id(unit)] -= 1  # `module`'s hold goes; the caller's own counts already
            elif not caller_holds:
                self.in_forward[id(unit)] += 1  # the caller's hold; `module`'s own is given back below
            caller._external_params[id(param)] = param
            if not caller_holds:
                self._add_external_unit(caller, unit)
                self._pin(unit)

    def _enter(self, module, args):
        """Forward pre-hook of a module without units of its own: the forward stack, and any external units."""
        if module is self.root:
            self.forward_stack.clear()  # what a forward that raised left on it
        self.forward_stack.append(module)
        if id(module) in self.units_of_module and not self._held(module):
            self._enter_units(module)

    def _exit(self, module, args, output):
        self._hand_up_returned(module, output)
        if id(module) in self.units_of_module and not self._held(module):
            self._release_after_forward(module)
        self._pop(module)

    def _pop(self, module: torch.nn.Module) -> None:
        for index in range(len(self.forward_stack) - 1, -1, -1):
            if self.forward_stack[index] is module:
                del self.forward_stack[index:]
                return

    def accept_gradient(self, param: torch.nn.Parameter, grad: torch.Tensor) -> None:
        """A gradient computed outside autograd's accumulation (a compiled backward that hands each one over
        instead of returning it): reduced with its unit, in the same fixed order as the hooks' gradients.
        `grad` is read now or copied: its memory may be reused as soon as this returns."""
        key = id(param)
        position, index = self.position_of[key]
        held = self.handed.get(key)
        if held is not None:
            held.add_(grad)
        else:
            self.handed[key] = grad
        if position < self.launcher.next:  # a second gradient after its unit was reduced (two graphs use it)
            self._reduce(self.order[position])
            return
        self.launcher.mark_ready(position, index)
        if held is None and self.handed.get(key) is grad:  # its unit waits for earlier ones: keep a copy
            self.handed[key] = grad.clone()

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
        busy = set(self.in_forward) | self.in_backward | {id(u) for u in needed}
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
        if module is self.root:
            self.forward_stack.clear()
        self.forward_stack.append(module)
        if self._held(module):
            return
        self._enter_units(module)

    def _enter_units(self, module) -> None:
        self.in_forward.update(id(u) for u in self.units_of_module[id(module)])
        self._need(module, True)

    def _after_forward(self, module, args, output):
        self._hand_up_returned(module, output)
        if not self._held(module):
            self._release_after_forward(module)
        self._pop(module)

    def _release_after_forward(self, module) -> None:
        # Released now unless reused soon; the backward pre-hook gathers them again before autograd reads them.
        for unit in self.units_of_module[id(module)]:
            key = id(unit)
            self.in_forward[key] -= 1
            if self.in_forward[key] > 0:
                continue  # an enclosing forward reads it too (an external parameter)
            del self.in_forward[key]
            if unit.persistent or key in self.pinned or self.reuse.keep_after_forward(
                    key, unit.layout.padded_numel, live_numel=self.live_numel()):
                continue
            unit.release()

    def _before_backward(self, module, grad_output):
        if self._held(module):
            raise ZeroError("a backward ran through parameters held gathered by HeldParameters (generation runs "
                            "without gradients); leave the block before training")
        self._need(module, False)
        self.in_backward.update(id(u) for u in self.units_of_module[id(module)])
        for unit in self.units_of_module[id(module)]:
            if unit.partition_only:
                self.backward_pending[id(unit)] = self.backward_pending.get(id(unit), 0) + 1

    def _after_backward(self, module, grad_input, grad_output):
        """The module's backward computed its inputs' gradients: its frozen units are read no more (they have no
        gradient of their own). torch also calls this before that backward when no positional input requires
        grad (grad_input all None); the units then stay gathered until backward ends."""
        if self._held(module) or all(g is None for g in grad_input):
            return
        for unit in self.units_of_module[id(module)]:
            key = id(unit)
            if not unit.partition_only or key not in self.backward_pending:
                continue
            self.backward_pending[key] -= 1
            if self.backward_pending[key] > 0:
                continue  # another call of the module (a shared one) still has its backward to run
            del self.backward_pending[key]
            unit.release()
            self.reuse.released(key)
            self.in_backward.discard(key)

    def _grad_hook(self, position: int, index: int):
        mark = weakly(self.launcher.mark_ready)  # weak: see ordered.weakly
        def hook(param):
            # No .grad: autograd ran the accumulation with nothing to add (a compiled backward handed the
            # gradient to accept_gradient instead, which marked it). Marking again would leave the member
            # ready for the next backward, whose first gradient would then launch every unit at once.
            if param.grad is not None:
                mark(position, index)
        return hook

    def release_gathered(self) -> None:
        """Release every gathered parameter that is not persistent or held (between steps: what a step's
        forward left gathered, the prefetch's reads included)."""
        self._release_all()

    def _release_all(self) -> None:
        self._complete_reductions()
        self.spare_flats.clear()  # backward ended: their memory goes back between steps
        for unit in self.units + self.frozen:
            unit.release()
        self.backward_pending.clear()
        for name, param in self.frozen_params:
            if param.grad is not None:  # made trainable after the engine was built
                param.grad = None
                _untrained_gradient(name, param)
        self.reuse.end_of_step()
        self.prefetch.end_of_step()
        if self.read_ahead is not None:
            self.read_ahead.end_of_step()
        self.in_forward.clear()
        self.in_backward.clear()
        self.pinned.clear()
        self.forward_stack.clear()

    def _reduce(self, unit: Unit) -> None:
        """The unit's gradients into a flat buffer (cast into the wire dtype as they are copied), its
        reduce-scatter launched; the unit is released at once. The reduction runs while backward goes on,
        and its result is added into the unit's shard (in the shard's dtype) when it completes: at the
        latest when the next but one unit is launched, or when backward ends. A unit over a process group of
        its own (experts over their expert-data group) is reduced over it and divided by its average_over."""
        flat, buffer = self._flat_gradients(unit)
        unit.release()
        self.reuse.released(id(unit))
        self.in_backward.discard(id(unit))
        world = unit.layout.world_size
        divisor = (unit.average_over or world) if self.average else 1
        averaged = self.average and divisor == world  # the collective averages over its own ranks
        then_divide = 1 if averaged else divisor  # experts: summed over their group, divided by the data-parallel size
        if world == 1:
            self._add(unit, flat, then_divide)
            self._spare(buffer)
        elif self.routes is not None and unit.group is self.group:  # ZeRO++'s routes are the data group's
            out = torch.empty(unit.grad_shard.numel(), dtype=flat.dtype, device=flat.device)
            self._add(unit, self.routes.reduce_scatter(unit, out, flat, average=averaged), then_divide)
            self._spare(buffer)
        else:
            self.reducing.append((unit, start_reduce_scatter(flat, unit.group, average=averaged,
                                                             log_name="zero3_reduce_scatter"), then_divide, buffer))
            if len(self.reducing) > REDUCTIONS_IN_FLIGHT:
                self._complete_oldest()

    @staticmethod
    def _add(unit: Unit, reduced: torch.Tensor, divisor: int) -> None:
        if divisor != 1:
            reduced.div_(divisor)
        unit.grad_shard.add_(reduced)

    def _flat_gradients(self, unit: Unit) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The unit's gradients in its flat layout and the wire dtype (padding and missing ones as zeros);
        each parameter's .grad is dropped. A lone gradient that already has that layout is used as it is.
        Also returns the buffer to reuse once the reduction is done (None: the gradient itself, not ours)."""
        wire = self.wire_dtype or unit.dtype
        handed = [self.handed.pop(id(param), None) for param in unit.params]  # accept_gradient's
        grad = unit.params[0].grad if len(unit.params) == 1 and handed[0] is None else None
        if grad is not None and grad.dtype == wire and grad.is_contiguous() and grad.numel() == unit.layout.padded_numel:
            unit.params[0].grad = None
            return grad.view(-1), None  # the embedding's or the output layer's: no copy of the largest units
        flat = self._flat_buffer(unit.layout.padded_numel, wire, unit.grad_shard.device)
        filled = 0
        for param, slot, given in zip(unit.params, unit.layout.slots, handed):
            if param.grad is not None:
                flat[slot.offset:slot.end].copy_(param.grad.reshape(-1))
                param.grad = None
                if given is not None:
                    flat[slot.offset:slot.end].add_(given.reshape(-1))
            elif given is not None:
                flat[slot.offset:slot.end].copy_(given.reshape(-1))
            else:
                flat[slot.offset:slot.end].zero_()
            filled = slot.end
        flat[filled:].zero_()  # the padding
        return flat, flat

    def _flat_buffer(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A flat buffer for a unit's gradients: a spare one of that size if there is one (its old values are
        all overwritten), else a new one."""
        for index, spare in enumerate(self.spare_flats):
            if spare.numel() == numel and spare.dtype == dtype and spare.device == device:
                return self.spare_flats.pop(index)
        self.spare_flats.clear()  # none fits: freed first, so a backward never holds more buffers than without reuse
        self.flat_allocations += 1
        return torch.empty(numel, dtype=dtype, device=device)

    def _spare(self, flat: torch.Tensor | None) -> None:
        """A flat gradient buffer nothing reads any more (its reduction completed) becomes a spare, while the
        spares and the buffers in flight are no more than can be in flight at once (and a spare that fits no
        next unit is freed before a new buffer is allocated), so reuse never holds more than a backward did."""
        if flat is not None and len(self.spare_flats) + len(self.reducing) <= REDUCTIONS_IN_FLIGHT:
            self.spare_flats.append(flat)

    def _complete_oldest(self) -> None:
        unit, pending, divisor, buffer = self.reducing.pop(0)
        self._add(unit, pending.wait(), divisor)
        self._spare(buffer)

    def _complete_reductions(self) -> None:
        while self.reducing:
            self._complete_oldest()

    # ------------------------------------------------------------------ for the optimizer
    def grad_shards(self) -> list[torch.Tensor]:
        return [u.grad_shard for u in self.units]

    def zero(self) -> None:
        self._complete_reductions()  # none is left after a backward; this keeps a late one out of the next step
        self.spare_flats.clear()
        self.handed.clear()
        for unit in self.units:
            unit.grad_shard.zero_()
            for param in unit.params:
                param.grad = None

    def reduce(self) -> list[torch.Tensor]:
        return self.grad_shards()

    def set_sync(self, enabled: bool) -> None:
        if not enabled:
            raise ZeroError("require_gradient_sync(False) at ZeRO stage 3: stage 3 reduce-scatters each unit's "
                            "gradient as its backward runs and keeps no full gradients to accumulate into; use "
                            "stage 0, 1 or 2 for schedules that hold gradient sync back")

    def finish_backward(self) -> None:
        self._complete_reductions()  # backward's end completed them already; a direct call waits here

    def grad_shard(self, index: int) -> torch.Tensor:
        """This rank's reduced (averaged, still loss-scaled) gradient shard of unit `index`, after
        finish_backward(); writing into it changes what the step applies."""
        return self.units[index].grad_shard

    def full_grad(self, index: int, slot: Slot, unscale: float) -> torch.Tensor:
        """One parameter's reduced gradient, gathered from its unit's shards and unscaled, in fp32 (collective)."""
        unit = self.units[index]
        return whole_slot(unit.grad_shard.float(), unit.layout, slot, unit.group) / unscale

    def unused_parameters(self) -> list[str]:
        return []  # not tracked: a unit's missing gradients are reduced as zeros

    def settings(self) -> dict[str, int]:
        return {"stage3_prefetch_bucket_size": self.prefetch.bucket,
                "stage3_max_reuse_distance": self.reuse.max_reuse_distance,
                "stage3_max_live_parameters": self.reuse.max_live}

    def buffer_bytes(self) -> int:
        return sum(u.grad_shard.numel() * u.grad_shard.element_size() for u in self.units)

    def comm_buffer_bytes(self) -> int:
        held = self.routes.buffer_bytes() if self.routes is not None else 0  # ZeRO++'s secondary copies
        return held + sum(u.gathered_bytes() for u in self.units + self.frozen)


def _untrained_gradient(name: str, param: torch.nn.Parameter) -> None:
    raise ZeroError(f"{name} was partitioned by dszero.Init and is not trained by the ZeRO stage-3 optimizer (it was "
                    f"frozen, or not given to the optimizer, when the engine was built), but it received a gradient; "
                    f"give the optimizer every parameter to train before initialize(), or set requires_grad=False")


def _returned_parameters(output: Any, candidates: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """Which of `candidates` are among a forward's outputs (the output itself, or the items of a tuple, list or
    dict): the parameter itself, or the alias a module's backward hook put in its place (same memory, same
    shape)."""
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else [output]
    tensors = [item for item in items if isinstance(item, torch.Tensor) and item.numel() > 0]
    if not tensors or not candidates:
        return []
    found = []
    for param in candidates:
        if param.numel() == 0:
            continue
        for item in tensors:
            if item is param or (item.data_ptr() == param.data_ptr() and item.shape == param.shape):
                found.append(param)
                break
    return found


def _eager(hook: Any) -> Any:
    """A hook torch.compile runs as it is, outside its graph (a graph break): gathering and releasing swap
    parameters' storage, which a traced graph cannot hold (engine.compile() of a stage-3 model without DeepCompile)."""
    return torch.compiler.disable(hook, recursive=True)
