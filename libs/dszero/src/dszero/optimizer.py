"""`ZeroOptimizer`: wraps a module and a torch optimizer with ZeRO partitioning and mixed precision.

    zero = ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), dsconfig.ZeroConfig(stage=2))
    loss = model(batch); zero.backward(loss); zero.step(); zero.zero_grad()

The optimizer keeps its class and hyper-parameters; its parameter groups are rebound to this
rank's flat master shards, so any optimizer whose update is elementwise (Adam, AdamW, SGD, ...)
works unchanged. One that needs whole tensors (Lamb, Muon) defines step_on_shards and is stepped
through it (whole_tensors.py).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

import dscomm
from dsconfig import ZeroConfig, resolve_auto

from . import fragments
from .errors import UnusedParametersError, ZeroConfigError, ZeroError
from .leaf_modules import apply_leaf_module_config
from .offload.optimizer_swap import SwappedStep
from .ops.cpu_adam import CPUAdam
from .policies import for_stage
from .precision import Precision
from .steps import InMemoryStep
from .whole_tensors import TensorShards, steps_on_shards
from .zeropp import ZeroPPSettings
from .zeropp import attach as attach_zeropp


class ZeroOptimizer:
    """ZeRO over `group` (default: dscomm's data-parallel group).

    precision: a `Precision` or "fp32" / "fp16" / "bf16" (the model must already be in that dtype).
    gradient_clipping: clip the global gradient norm to this value (0 disables).
    aio: keyword arguments of `dsaio.aio_handle` for NVMe offload (block_size, queue_depth, ...).
    gradient_average: average gradients over the ranks (False: sum them).
    gradient_predivide_factor: divide local gradients by this before the reduction and multiply the
        result back after it (the reference's key: for fp16, a sum that would overflow stays in range).
    prescale_gradients: divide local gradients by the world size before the reduction (then summed).
    grad_accum_dtype: the dtype gradients accumulate in over micro-steps (data_types.grad_accum_dtype);
        None: the model's dtype. Every stage.
    communication_dtype: the dtype gradients go over the wire in (communication_data_type); None:
        the dtype they are reduced from (the accumulation dtype at stages 0-1, where the reduction
        runs once at the step; the model's dtype at stages 2-3, which reduce each backward's gradients).
    norm_group: the ranks that decide together on the gradient norm, clipping and an fp16 overflow
        skip (default `group`). Give every rank of the model (pipeline stages, tensor shards) so that
        they clip by one norm and skip the same steps.
    zeropp: how ZeRO++ quantizes (`dszero.ZeroPPSettings`: block sizes, bits, error feedback); the
        config's zero_hpz_partition_size / zero_quantized_weights / zero_quantized_gradients turn it on.

    Parameter groups may carry (popped at wrap time, so the optimizer's own groups stay plain data):
    "process_group": partition and reduce this group over it instead of `group` (e.g. experts over
        their expert-data-parallel group); "gradient_average_over": divide its summed gradients by
        this instead of the process group's size (experts: the data-parallel size);
        "norm_replicas": how many ranks of `norm_group` hold identical copies of its gradients besides
        the group itself (tensor-replicated weights: the tensor degree; a tied pipeline weight: its
        stages), so the norm counts them once.

    Controls for schedules that run many backward passes per step (pipelines):
    `require_gradient_sync(False)` makes backward passes accumulate locally and communicate nothing;
    `finish_backward()` says the step's gradients are complete and reduces them (step() calls it).
    """

    GROUP_KEYS = ("process_group", "gradient_average_over", "norm_replicas")

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, config: ZeroConfig | None = None,
                 *, precision: Precision | str | None = None, gradient_clipping: float = 0.0, group: Any = None,
                 aio: Any = None, gradient_average: bool = True, grad_accum_dtype: torch.dtype | None = None,
                 gradient_predivide_factor: float = 1.0, prescale_gradients: bool = False,
                 communication_dtype: torch.dtype | None = None, norm_group: Any = None,
                 zeropp: ZeroPPSettings | None = None):
        # Every "auto" tuning knob becomes dsconfig's number: the one table all libraries share.
        self.config = resolve_auto(config or ZeroConfig())
        self.stage = self.config.stage
        # The one place the stage is read: from here on the optimizer asks its policies (policies/).
        self.policies = for_stage(self.stage)
        self.precision = Precision.coerce(precision)
        self.gradient_clipping = float(gradient_clipping)
        # data_types.grad_accum_dtype: by default gradients accumulate in the model's dtype, as DeepSpeed's do.
        self.grad_accum_dtype = grad_accum_dtype
        self.module = module
        self.optimizer = optimizer
        apply_leaf_module_config(module, getattr(self.config, "leaf_module", None))  # before stage 3 hooks modules
        self._check_supported()
        self.offload = self.config.optimizer_offload_device in ("cpu", "nvme")
        self.aio = dict(aio) if aio else None
        if not dscomm.is_initialized():
            dscomm.init_distributed()
        self.process_group = group if group is not None else dscomm.groups.get_data_parallel_group()
        self.norm_group = norm_group if norm_group is not None else self.process_group
        self.world = dist.get_world_size(self.process_group)
        self._group_settings = self._take_group_settings(optimizer)
        self.gradient_sync = True
        self.rank = dist.get_rank(self.process_group)
        self.scaler = self.precision.make_scaler()
        self.communication_dtype = communication_dtype
        if not gradient_predivide_factor > 0:
            raise ZeroConfigError(f"gradient_predivide_factor = {gradient_predivide_factor}: must be positive")
        # Pre-division rides on the loss scale (gradients are linear in the loss) and is undone at the unscale.
        prescale = prescale_gradients and gradient_average and self.world > 1
        self.pre_scale = 1.0 / self.world if prescale else 1.0 / gradient_predivide_factor
        # Prescaling is the averaging itself (the reduction then sums); a predivision is undone after the reduction.
        self._undone_at_unscale = 1.0 if prescale else self.pre_scale
        if prescale:
            gradient_average = False
            odd = [i for i, g in enumerate(self._group_settings)
                   if (g["average_over"] or dist.get_world_size(g["group"])) != self.world]
            if odd:
                raise ZeroConfigError(f"prescale_gradients divides every gradient by the data-parallel size "
                                      f"{self.world}, but parameter group(s) {odd} are averaged over another number "
                                      f"of ranks (their own process_group or gradient_average_over); leave "
                                      f"prescale_gradients off")
        self.global_grad_norm: float | None = None
        self.skipped_steps = 0
        # Whether the last step was skipped for an fp16 overflow: DeepSpeed's optimizers (FP16_Optimizer, ZeRO
        # stages 1-3) keep it as `overflow`, which RLHF loops read (DeepSpeed-Chat's get_overflow).
        self.overflow = False
        # What this rank holds (flat groups or stage-3 units), and the reducer that brings their gradients.
        self.groups = self.policies.partition.build(self, module, optimizer, self._group_settings)
        self.reducer = self.policies.reduction.build(self, self.groups, gradient_average)
        self.zeropp = attach_zeropp(self, zeropp)  # ZeRO++'s routes for stage 3's gathers and reductions
        # Optimizers that need whole tensors step on the shards through this (whole_tensors.py).
        self.tensor_shards = TensorShards(self.groups) if steps_on_shards(optimizer) else None
        self.stepper = self._make_stepper()
        fragments.register(self)  # safe_get_full_fp32_param & co. find their optimizer from the parameter

    # ------------------------------------------------------------------ construction
    def _check_supported(self) -> None:
        cfg, partition = self.config, self.policies.partition
        if cfg.param_offload_device != "none" and not partition.partitions_parameters:
            raise ZeroConfigError(f"zero_optimization.offload_param (device {cfg.param_offload_device!r}) needs "
                                  f"stage 3 (stage is {cfg.stage}): only stage 3 partitions parameters")
        if cfg.optimizer_offload_device != "none" and not partition.shards_optimizer_state:
            raise ZeroConfigError(f"zero_optimization.offload_optimizer (device {cfg.optimizer_offload_device!r}) "
                                  f"needs stage 1, 2 or 3 (stage is 0)")
        if self.precision.dtype == "fp32" and self.precision.master_dtype != "fp32":
            raise ZeroConfigError("low-precision master weights need fp16 or bf16 training")
        self._check_state_dtype()

    def _check_state_dtype(self) -> None:
        """Low-precision masters keep fp32 optimizer states only through CPUAdam (torch's optimizers make
        their state in the parameter's dtype), as the reference requires DeepSpeedCPUAdam for it."""
        master, states = self.precision.master_dtype, self.precision.optimizer_state_dtype
        if master not in ("bf16", "fp16"):
            return
        key = f"{master}.{master}_master_weights_and_grads"
        if isinstance(self.optimizer, CPUAdam):
            wrong = [i for i, g in enumerate(self.optimizer.param_groups)
                     if g.get("fp32_optimizer_states", True) != (states == "fp32")]
            if wrong:
                raise ZeroConfigError(f"{key} with {states} optimizer states, but CPUAdam param group(s) {wrong} have "
                                      f"fp32_optimizer_states={states != 'fp32'}; build it with "
                                      f"fp32_optimizer_states={states == 'fp32'}")
        elif states == "fp32":
            raise ZeroConfigError(f"{key} keeps the optimizer states in fp32 only with dszero.ops.CPUAdam under "
                                  f"offload_optimizer (a {type(self.optimizer).__name__} would make them {master}); "
                                  f"use CPUAdam (the config's Adam/AdamW is built as one), or keep the states in "
                                  f"bf16 (bf16.bf16_optimizer_states: true)")

    def _take_group_settings(self, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
        """Each param group's process group, divisor and norm replicas (removed from the group)."""
        settings = []
        for index, param_group in enumerate(optimizer.param_groups):
            taken = {key: param_group.pop(key) for key in self.GROUP_KEYS if key in param_group}
            group = taken.get("process_group", self.process_group)
            if dist.get_rank(group) < 0:
                raise ZeroError(f"optimizer param group {index}: this rank ({dist.get_rank()}) is not in its "
                                f"process_group (ranks {dscomm.groups.get_group_ranks(group)})")
            for key in ("gradient_average_over", "norm_replicas"):
                value = taken.get(key)
                if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                    raise ZeroError(f"optimizer param group {index}: {key} = {value!r} must be a positive integer")
            settings.append({"group": group, "average_over": taken.get("gradient_average_over"),
                             "norm_replicas": taken.get("norm_replicas", 1)})
        return settings

    def _make_stepper(self) -> InMemoryStep | SwappedStep:
        if self.config.optimizer_offload_device != "nvme":
            return InMemoryStep(self.optimizer, self.groups, self.offload, self.tensor_shards)
        size = self.config.sub_group_size
        # DeepSpeed's key for Muon: its momentum stays in memory instead of going through the swap file.
        keep = ("momentum_buffer",) if self.config.save_muon_momentum_buffer_in_memory else ()
        return SwappedStep(self.optimizer, self.groups, self.config.offload_optimizer,
                           size, dist.get_rank(), self.aio, shards=self.tensor_shards, keep_in_memory=keep)

    # ------------------------------------------------------------------ training
    @property
    def partitions_parameters(self) -> bool:
        """Whether the module's parameters live only in this optimizer's shards (stage 3)."""
        return self.policies.partition.partitions_parameters

    def masters_from_module(self) -> None:
        """Take the module's current weights as the master weights, after the module was loaded directly."""
        if self.partitions_parameters:
            raise ZeroError("at stage 3 the module's parameters live in the ZeRO shards: load them with load()")
        with self.stepper.resident(write_back=True):
            for flat in self.groups:
                if flat.separate_master:
                    self.policies.partition.master_from_model(flat)

    # DeepSpeed's names for this rank's fp32 master partitions, one per flat group (stages 0-2: a parameter group;
    # stage 3: a module's unit), as DeepSpeed's wrappers expose them at each stage. Under optimizer offload
    # they are the CPU masters (NVMe: while resident).
    @property
    def master_partitions(self) -> list[torch.Tensor]:
        return [group.master for group in self.groups if group.master is not None]

    @property
    def single_partition_of_fp32_groups(self) -> list[torch.Tensor]:  # DeepSpeedZeroOptimizer (stages 1-2)
        return self.master_partitions

    @property
    def fp32_partitioned_groups_flat(self) -> list[torch.Tensor]:  # DeepSpeedZeroOptimizer_Stage3
        return self.master_partitions

    @property
    def fp32_groups_flat(self) -> list[torch.Tensor]:  # FP16_Optimizer / BF16_Optimizer (stage 0)
        return self.master_partitions

    # DeepSpeed's names for stage 3's module hooks (its parameter_offload's handle lists; [] below stage 3 and while
    # a compiler or unwrap_model_for_generation has them off).
    @property
    def forward_hooks(self) -> list[Any]:
        return [h for i, h in enumerate(getattr(self.reducer, "module_hook_handles", ())) if i % 3 != 2]

    @property
    def backward_hooks(self) -> list[Any]:
        return list(getattr(self.reducer, "module_hook_handles", ()))[2::3]

    def empty_partition_cache(self) -> None:
        """Stage 3: release the parameters left gathered (DeepSpeed's engine.empty_partition_cache); a no-op
        below stage 3, where parameters are never partitioned."""
        if self.partitions_parameters:
            self.reducer.release_gathered()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups (lr, betas, ...), as torch optimizers expose them."""
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's state (Adam's exp_avg / exp_avg_sq ...), keyed by this rank's master partitions
        (`master_partitions`), as DeepSpeed's ZeRO optimizers expose their wrapped optimizer's. Under NVMe
        optimizer offload its tensors are empty placeholders between steps (state_dict() reads them whole)."""
        return self.optimizer.state

    @property
    def loss_scaler(self) -> Any:
        """DeepSpeed's name for the loss scaler (`cur_scale`, and `cur_iter` / `scale_window` when dynamic)."""
        return self.scaler

    @property
    def loss_scale_config(self) -> Any:
        """DeepSpeed's newer name for the same scaler (`dynamic_loss_scale`, `cur_scale`, `cur_iter`,
        `scale_window`, `min_loss_scale`), which its engine's loss_scale reads."""
        return self.scaler

    @property
    def dynamic_loss_scale(self) -> bool:
        return self.scaler.dynamic

    @property
    def cur_scale(self) -> float:
        return self.scaler.scale

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    @property
    def gradient_unscale(self) -> float:
        """What reduced gradients are divided by before the step: the fp16 loss scale times any pre-division
        that the reduction did not undo."""
        return self.scaler.scale * self._undone_at_unscale

    @property
    def backward_scale(self) -> float:
        """What a loss is multiplied by before backward: the fp16 loss scale times any gradient pre-division."""
        return self.scaler.scale * self.pre_scale

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        """loss.backward(), with the fp16 loss scale (and gradient pre-division) applied."""
        scale = self.backward_scale
        (loss * scale if scale != 1.0 else loss).backward(retain_graph=retain_graph)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.reducer.zero()

    # ------------------------------------------------------------------ controls for schedules
    def require_gradient_sync(self, enabled: bool) -> None:
        """False: the following backward passes accumulate gradients locally and communicate nothing (a
        pipeline's many micro-batches); True (the default): reduce as each backward runs, as DeepSpeed does."""
        self.reducer.set_sync(bool(enabled))  # a reducer that cannot hold gradients back refuses (stage 3)
        self.gradient_sync = bool(enabled)

    def finish_backward(self) -> None:
        """The step's gradients are complete: reduce whatever accumulated and wait for every reduction.
        Idempotent; step() calls it."""
        self.reducer.finish_backward()

    @contextlib.contextmanager
    def coalesced_reduction(self) -> Iterator[None]:
        """The backward passes inside accumulate their gradients locally and the block's end reduces them once
        (DeepSpeed's engine.coalesce_grad_reduction): fewer collectives per step, the same gradients. At stage 3,
        which keeps no full gradients to accumulate into, each backward reduce-scatters as usual. An exception
        inside reduces nothing at once (ranks may disagree); the next finish_backward() or step() does."""
        holds = self.reducer.holds_gradients_back and self.gradient_sync
        if holds:
            self.require_gradient_sync(False)
        try:
            yield
        except BaseException:
            if holds:
                self.require_gradient_sync(True)
            raise
        if holds:
            self.require_gradient_sync(True)
            self.finish_backward()

    def tensor_views(self, group_index: int) -> list[tuple[str, torch.Tensor]]:
        """(name, view) of every parameter in one group's flat master weights, for per-tensor optimizers
        without a whole-tensor step (step_on_shards, see whole_tensors.py). Stage 0 only."""
        flat = self.groups[group_index]
        if not self.policies.partition.whole_tensors:
            raise ZeroError(f"tensor_views needs whole tensors on every rank; at stage {self.stage} each rank holds "
                            f"a flat shard that cuts tensors apart: give the optimizer a step_on_shards "
                            f"(dszero.TensorShards) to run it at any stage")
        return [(slot.name, flat.master[slot.offset:slot.end].view(slot.shape)) for slot in flat.layout.slots]

    def step(self) -> bool:
        """Reduce gradients, then update: returns False when the step was skipped for an fp16 overflow."""
        self.finish_backward()
        if not self.config.ignore_unused_parameters:
            unused = self.reducer.unused_parameters()
            if unused:
                raise UnusedParametersError(
                    f"zero_optimization.ignore_unused_parameters is false and {len(unused)} parameter(s) got no "
                    f"gradient in this step (first: {', '.join(unused[:3])}); set it to true (the default) to train "
                    f"on, or use every parameter in the forward")
        shards = self.reducer.reduce()
        # To the master's dtype and device (the CPU under optimizer offload); a copy whenever either differs.
        grads = [shard.to(device=flat.master.device, dtype=flat.master.dtype) for shard, flat in zip(shards, self.groups)]
        unscale = self.gradient_unscale
        if unscale != 1.0:
            for grad in grads:
                grad.div_(unscale)
        stats = self._norm_and_overflow(grads)
        overflow = stats[1].item() > 0
        self.overflow = overflow
        if overflow:
            self.scaler.update(True)
            self.skipped_steps += 1
            self.global_grad_norm = math.inf
            self.reducer.zero()
            return False
        norm = math.sqrt(stats[0].item())
        self.global_grad_norm = norm
        if self.gradient_clipping > 0 and norm > self.gradient_clipping:
            factor = self.gradient_clipping / (norm + 1e-6)
            for grad in grads:
                grad.mul_(factor)
        self.stepper.step(grads)  # updates the masters and copies them into this rank's model shard
        self._publish_weights()
        self.scaler.update(False)
        self.reducer.zero()
        return True

    def _norm_and_overflow(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """[squared global gradient norm, overflow flag], the same on every rank of the norm group."""
        rows, local = self._norm_rows(grads)
        squares = rows[:, 0].tolist()
        finite = all(math.isfinite(value) for value in squares)
        sq_sum = 0.0
        for value in squares:  # in order, as a float: the step's norm does not depend on how it is reduced
            sq_sum += value
        stats = torch.tensor([sq_sum if finite else 0.0, 0.0 if finite else 1.0], dtype=torch.float64)
        if not local:
            dscomm.all_reduce(stats, group=self.norm_group, log_name="zero_grad_norm")
        return stats

    def _norm_rows(self, grads: list[torch.Tensor]) -> tuple[torch.Tensor, bool]:
        """(each group's squared gradient norm on this rank, float64, [groups, 1]; whether that is already the
        whole norm group's). Each group's square is divided by how many ranks of the norm group hold the same
        values (its own replicas at stage 0, plus its norm_replicas), so summing over the group counts each once."""
        norm = self.policies.norm
        local = norm.is_local(self.groups, self.process_group, self.norm_group) or \
            dist.get_world_size(self.norm_group) == 1
        squares = []
        for grad, flat in zip(grads, self.groups):
            # One fused pass per shard (no float64 copy); any inf/nan makes the square non-finite.
            value = torch.linalg.vector_norm(grad, dtype=torch.promote_types(grad.dtype, torch.float32)).item() ** 2 \
                if grad.numel() else 0.0
            squares.append(value if local else value / norm.replicas(flat, self.process_group))
        return torch.tensor(squares, dtype=torch.float64).reshape(-1, 1), local

    def _share_updated_weights(self) -> None:
        """After the masters changed outside a step (loading): into the model shards, then to every rank."""
        for flat in self.groups:
            flat.master_to_model()
        self._publish_weights()

    def _publish_weights(self) -> None:
        """Every rank's updated shard to where the model reads it."""
        self.policies.publish.publish(self.groups)

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm of the last step (before clipping); inf when it overflowed."""
        return self.global_grad_norm

    @property
    def _global_grad_norm(self) -> float | None:  # DeepSpeed's name
        return self.global_grad_norm

    def _get_norm_groups(self) -> list[torch.Tensor]:
        """Each param group's gradient norm as the next step() will see it (reduced, averaged, unscaled, before
        clipping; inf when not finite), the same on every rank: DeepSpeed's name, for scripts that clip the
        gradients themselves (safe_set_local_grad) and read the norm again. One all-reduce over the norm group.
        Stages 2 and 3: below them each rank's gradients are reduced only at the step."""
        self.finish_backward()
        shards = [self.reducer.grad_shard(index) for index in range(len(self.groups))]
        if any(shard is None for shard in shards):
            raise ZeroError(f"_get_norm_groups: at ZeRO stage {self.stage} gradients are reduced only at the "
                            f"step; the norm of the reduced gradients before it needs stage 2 or 3 (after the "
                            f"step, get_global_grad_norm() has it at every stage)")
        rows, local = self._norm_rows([shard.to(dtype=flat.master.dtype) / self.gradient_unscale
                                       for shard, flat in zip(shards, self.groups)])
        if not local:
            dscomm.all_reduce(rows, group=self.norm_group, log_name="zero_grad_norm")  # inf / nan stay so
        return [torch.tensor(math.sqrt(square) if math.isfinite(square) else math.inf) for square in rows[:, 0].tolist()]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """This rank's shard: master weights, optimizer state and loss scaler (same world size to load)."""
        with self.stepper.resident():
            return {
                "zero_stage": self.stage,
                "world_size": self.policies.save.saved_world(self.world),
                "rank": self.rank,
                "master": [flat.master.clone() for flat in self.groups],
                "optimizer": copy.deepcopy(self.optimizer.state_dict()) if self.stepper.where == "nvme"
                else self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "skipped_steps": self.skipped_steps,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policies.save.check_state(state, self.stage, self.world)
        with self.stepper.resident(write_back=True):
            for flat, master in zip(self.groups, state["master"], strict=True):
                flat.master.copy_(master)
            self.optimizer.load_state_dict(state["optimizer"])
            self._share_updated_weights()
        self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))

    def save(self, directory, *, node_local: bool = False) -> Any:
        """Write a sharded checkpoint (collective); see dszero.checkpoint (node_local: per-node disks)."""
        from .checkpoint import save

        with self.stepper.resident():
            return save(self, directory, node_local=node_local)

    def load(self, directory, load_optimizer_states: bool = True) -> None:
        """Load a checkpoint saved at any data-parallel world size (collective)."""
        from .checkpoint import load

        with self.stepper.resident(write_back=True):
            load(self, directory, load_optimizer_states)
            if not self.config.load_from_fp32_weights:
                self._masters_from_model_weights()

    def _masters_from_model_weights(self) -> None:
        """load_from_fp32_weights: false: the master weights start from the loaded 16-bit model weights
        (with their precision loss), not from the checkpoint's fp32 masters, as the reference says."""
        for group in self.groups:
            if group.separate_master:
                self.policies.partition.master_from_model(group)

    def offload_states(self, include: Any = None, device: str = "cpu", pin_memory: bool = True,
                       non_blocking: bool = False) -> None:
        """Move optimizer states (and separate master weights) to host memory, freeing the device between
        phases (DeepSpeed's engine.offload_states, used by RLHF loops); reload_states() brings them back."""
        kinds = {str(getattr(k, "value", k)) for k in include} if include is not None else {"optim_states", "hp_params"}
        unknown = kinds - {"optim_states", "hp_params"}
        if unknown or device != "cpu":
            # lp_params / lp_grads / contiguous_grad_buffer would move the model's own flat buffers, which its
            # parameters view: not offloadable here, so refused rather than silently kept.
            raise ZeroError(f"offload_states(include={sorted(kinds)}, device={device!r}): dszero offloads "
                            f"optim_states and hp_params, to device 'cpu'")
        self._offloaded = getattr(self, "_offloaded", [])
        for tensor in self._movable_states(kinds):
            if tensor.device.type != "cpu":
                moved = tensor.data.to("cpu", non_blocking=non_blocking)
                self._offloaded.append((tensor, tensor.device))
                tensor.data = moved.pin_memory() if pin_memory and torch.cuda.is_available() else moved

    def reload_states(self, non_blocking: bool = False) -> None:
        """Bring back what offload_states() moved, to the device each tensor came from."""
        for tensor, home in getattr(self, "_offloaded", []):
            tensor.data = tensor.data.to(home, non_blocking=non_blocking)
        self._offloaded = []

    def _movable_states(self, kinds: set[str]) -> list[torch.Tensor]:
        found: list[torch.Tensor] = []
        if "optim_states" in kinds:
            found += [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        if "hp_params" in kinds:
            found += [g.master for g in self.groups if getattr(g, "separate_master", False) and g.master is not None]
        return found

    def effective_settings(self) -> dict[str, int]:
        """The tuning knobs this optimizer runs with, read from the parts that use them (config paths
        under zero_optimization), after dsconfig resolved any "auto": what to check a config against."""
        used = {**self.reducer.settings(), **self.policies.partition.settings()}
        if self.config.optimizer_offload_device == "nvme":
            used["sub_group_size"] = self.stepper.sub_group_size
        return used

    # ------------------------------------------------------------------ memory
    def memory_report(self) -> dict[str, int]:
        """Bytes this rank holds, by kind, and by where they live.

        Kinds: parameters (at stage 3 this rank's shards; gathered parameters count as communication
        buffers), gradients, master_weights (when separate from the parameters), optimizer_state,
        communication_buffers and offload_buffers (host buffers that NVMe swapping reads into); total
        is their sum. Places: device_bytes (the compute device's memory), cpu_offload_bytes (host
        buffers of CPU offload) and nvme_bytes (swap files); they add up to total too.
        """
        # (kind, place, bytes); stage 3's frozen Init units hold shards too
        entries = self.policies.partition.parameter_bytes(self.groups + list(getattr(self.reducer, "frozen", ())))
        entries.append(("gradients", "device", self.reducer.buffer_bytes()))
        entries.append(("master_weights", self.stepper.where, self.stepper.master_bytes()))
        entries.append(("optimizer_state", self.stepper.where, self.stepper.state_bytes()))
        entries.append(("optimizer_state", "cpu", self.stepper.resident_state_bytes()))
        entries.append(("offload_buffers", "cpu", self.stepper.buffer_bytes()))
        entries.append(("communication_buffers", "device", self.reducer.comm_buffer_bytes()))
        kinds = ("parameters", "gradients", "master_weights", "optimizer_state", "communication_buffers",
                 "offload_buffers")
        report = {kind: sum(n for k, _, n in entries if k == kind) for kind in kinds}
        report["total"] = sum(n for _, _, n in entries)
        for place in ("device", "cpu", "nvme"):
            report[f"{place}_offload_bytes" if place == "cpu" else f"{place}_bytes"] = sum(
                n for _, p, n in entries if p == place)
        return report
