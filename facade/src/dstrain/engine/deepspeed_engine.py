"""`DeepSpeedEngine`: the module, its ZeRO optimizer, scheduler, loader and reporting behind one
forward / backward / step loop, as DeepSpeed's engine presents them. The engine drives the loop; its
parts (`parts.build_training_parts`) are built, saved and reported on without it."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import torch

from dscomm import watchdog
from dsconfig import DeepSpeedConfig, Problem

from ..errors import DstrainError, EngineUsageError
from ..logs import log_on_rank0
from . import deepspeed_precision_names
from .accessors import EngineAccessors
from .parts import build_training_parts

# Private methods of DeepSpeed's engine that integrations call (Accelerate, transformers): a missing one is named
# with who asked, as a missing public one is.
_DEEPSPEED_PRIVATE_API = {"_consolidated_16bit_state_dict", "_zero3_consolidated_16bit_state_dict"}



def _functorch_transforming() -> bool:
    """Inside torch.func.grad / vmap / jacrev (their gradients are the function's own, not a training step's)."""
    peek = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
    return peek is not None and peek() is not None

class DeepSpeedEngine(EngineAccessors, torch.nn.Module):
    """Built by `dstrain.initialize()`; `engine(*inputs)`, `engine.backward(loss)`, `engine.step()`."""

    pipeline_parallelism = False  # DeepSpeed's flag; the pipeline engine is dstrain.PipelineEngine
    # DeepSpeed's private mixed-precision steps, callable on the class with a stand-in for the engine
    _mixed_precision_dtypes = deepspeed_precision_names.mixed_precision_dtypes
    _assert_valid_mixed_precision_config = deepspeed_precision_names.assert_valid_mixed_precision_config
    _cast_module_mixed_precision = deepspeed_precision_names.cast_module_mixed_precision

    def __init__(self, *, model: torch.nn.Module, config: DeepSpeedConfig, optimizer: Any = None,
                 model_parameters: Any = None, training_data: Any = None, lr_scheduler: Any = None,
                 collate_fn: Any = None, data_parallel_group: Any = None, groups: Any = None,
                 step_hooks: list | None = None):
        super().__init__()
        parts = build_training_parts(model, config, optimizer=optimizer, model_parameters=model_parameters,
                                     training_data=training_data, lr_scheduler=lr_scheduler, collate_fn=collate_fn,
                                     data_parallel_group=data_parallel_group, groups=groups, step_hooks=step_hooks)
        self.adopt_parts(parts, config, model)
        # DeepSpeed's names: data_parallel_group holds the replicas, seq_data_parallel_group ZeRO's ranks.
        self.seq_data_parallel_group = data_parallel_group
        self.data_parallel_group = groups.data if parts.sequence_parallel_size > 1 else data_parallel_group
        self.seq_parallel_group = groups.sequence if parts.sequence_parallel_size > 1 else None
        self._hybrid = None  # the Hybrid Engine's generation (hybrid_engine.enabled): engine/hybrid/
        if config.hybrid_engine.enabled:
            from .hybrid import HybridGeneration

            self._hybrid = HybridGeneration(model, config, device=parts.device, data_group=data_parallel_group,
                                            rank=parts.global_rank, zero=parts.optimizer)
        self._engine_backward_active = False
        self._compiled = False
        self.deepcompile_runtime: Any = None  # dscompile's, after compile() with compile.deepcompile
        if config.dump_state:
            log_on_rank0(self.global_rank, self._state_text())
        # What trains, not what the config named: a client's optimizer or scheduler wins over the config's.
        named = {f"optimizer {config.optimizer.type}" if config.optimizer else None,
                 f"scheduler {config.scheduler.type}" if config.scheduler else None}
        features = [f for f in config.enabled_features() if f not in named]
        features += [f"{kind} {type(obj).__name__}" for kind, obj in
                     (("optimizer", parts.basic_optimizer), ("scheduler", parts.lr_scheduler)) if obj is not None]
        features = ", ".join(features) or "plain data parallelism"
        log_on_rank0(self.global_rank, f"engine ready: {self.dp_world_size} data-parallel rank(s), {features}; "
                                       f"batch {self.train_batch_size()} = micro {self.train_micro_batch_size_per_gpu()}"
                                       f" x accumulation {self.gradient_accumulation_steps()} x ranks "
                                       f"{self.dp_world_size}")

    # ------------------------------------------------------------------ the loop
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        watchdog.record(f"engine forward of micro-step {self.micro_steps + 1} (step {self.global_steps + 1})")
        if not self._compiled and self._config.compile.deepcompile and "autosp" in self._config.compile.passes:
            why = Problem("compile.passes", "AutoSP shards each sequence inside the compiled graph: call "
                                            "engine.compile() before the first forward (uncompiled, every rank would "
                                            "train the whole sequence unsharded)", ["autosp"])
            raise DstrainError(f"engine.forward before engine.compile():\n- {why}")
        self.reporter.before_forward()
        timer = self.reporter.timer("fwd")
        timer.start()
        inputs = self.precision.cast_inputs(inputs)
        kwargs = self.precision.cast_inputs(kwargs)
        with self.precision.forward_context():
            output = self.module(*inputs, **kwargs)
        timer.stop()
        if (self.module.training and torch.is_grad_enabled() and self.optimizer is not None
                and not _functorch_transforming()):
            _hook_outputs(output, self._scale_plain_backward)
        return output

    def _loss_factor(self) -> float:
        """What a loss is multiplied by before backward: 1 / accumulation steps (managed) times the fp16 scale."""
        factor = self.optimizer.backward_scale if self.optimizer is not None else 1.0
        if self._config.managed_gradient_accumulation:
            factor /= self.gradient_accumulation_steps()
        return factor

    def _scale_plain_backward(self, grad: torch.Tensor) -> torch.Tensor | None:
        # A plain loss.backward() skips engine.backward's scaling: apply it to what flows into the outputs.
        if self._engine_backward_active or _functorch_transforming():
            return None  # torch.func.grad(engine) differentiates the module as it is: nothing to scale
        factor = self._loss_factor()
        return grad * factor if factor != 1.0 else None

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """loss.backward() with gradient-accumulation averaging and the fp16 loss scale. Returns the loss as its
        gradients count, as DeepSpeed does: divided by gradient_accumulation_steps (unless scale_wrt_gas=False)."""
        self._require_optimizer("backward")
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise DstrainError(f"engine.backward(loss) needs a one-element loss tensor, got "
                               f"{tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__}")
        watchdog.record(f"engine backward of micro-step {self.micro_steps + 1} (step {self.global_steps + 1})")
        self.reporter.record_loss(loss)
        timer = self.reporter.timer("bwd")
        timer.start()
        factor = self._loss_factor() if scale_wrt_gas else self.optimizer.backward_scale
        self._engine_backward_active = True
        try:
            (loss * factor if factor != 1.0 else loss).backward(retain_graph=retain_graph)
        finally:
            self._engine_backward_active = False
        self._progress.record_backward()
        timer.stop()
        gas = self.gradient_accumulation_steps()
        return loss / gas if scale_wrt_gas and gas != 1 else loss

    def _backward_epilogue(self) -> None:
        """DeepSpeed's step after autograd, for scripts that call loss.backward() themselves (several engines
        under one shared loss): the backward counts toward the coming step, as engine.backward's own does."""
        self._require_optimizer("_backward_epilogue")
        self._progress.record_backward()

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next step() updates the weights."""
        managed = self._config.managed_gradient_accumulation
        return self._progress.is_boundary(self.gradient_accumulation_steps() if managed else None)

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Override the boundary (e.g. at the end of an epoch); None returns to counting micro-steps."""
        self._progress.boundary_override = is_boundary

    @property
    def _is_gradient_accumulation_boundary(self) -> bool | None:
        """What set_gradient_accumulation_boundary set (None: micro-steps are counted), as DeepSpeed's engine keeps
        it."""
        return self._progress.boundary_override

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients on this rank only (DDP's no_sync, DeepSpeed's): at ZeRO
        stages 0-1 gradients are reduced at the step anyway, so the step after the block applies what the passes
        inside accumulated; step() inside is refused. Stages 2-3 reduce as gradients arrive (partitioning them),
        so it is refused there."""
        stage = self.zero_optimization_stage()
        if stage >= 2:
            raise EngineUsageError(f"no_sync context manager is incompatible with gradient partitioning logic of ZeRO "
                                   f"stage {stage}: zero_optimization.stage 2 and 3 reduce gradients as they arrive; "
                                   f"use stage 0 or 1, or gradient_accumulation_steps")
        if getattr(self, "_inside_no_sync", False):
            raise EngineUsageError("no_sync context manager reentry is unsupported: leave the outer one first")
        self._inside_no_sync = True
        try:
            yield
        finally:
            self._inside_no_sync = False

    @contextlib.contextmanager
    def coalesce_grad_reduction(self) -> Iterator[None]:
        """One with-block, one optimizer step (DeepSpeed's name): the engine.backward() calls inside accumulate
        gradients locally and the block's end reduces them in one pass, at any ZeRO stage (stage 3 reduce-scatters
        each backward as it runs: the same gradients). step() inside is refused, and so is nesting with no_sync()."""
        self._require_optimizer("coalesce_grad_reduction")
        if getattr(self, "_inside_no_sync", False):
            raise EngineUsageError("coalesce_grad_reduction cannot be nested inside another no_sync context "
                                   "(no_sync or coalesce_grad_reduction): leave the outer one first")
        self._inside_no_sync = True
        try:
            with self.optimizer.coalesced_reduction():
                yield
        finally:
            self._inside_no_sync = False

    def step(self, lr_kwargs: dict | None = None) -> None:
        """Count the micro-batch; at the accumulation boundary, update the weights and the scheduler."""
        self._require_optimizer("step")
        if getattr(self, "_inside_no_sync", False):
            raise EngineUsageError("It is illegal to call Engine.step() inside no_sync context manager: the gradients "
                                   "accumulated there are this rank's alone; step after the with-block")
        progress, optimizer = self._progress, self.optimizer
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            watchdog.record(f"engine optimizer step {self.global_steps + 1}")
        timer = self.reporter.timer("step")
        timer.start()
        progress.last_step_applied = False
        if boundary:
            progress.last_step_applied = optimizer.step()
            if progress.last_step_applied and self.lr_scheduler is not None:
                self.lr_scheduler.step(**(lr_kwargs or {}))
        timer.stop()
        self.reporter.micro_step_done(boundary)
        if not boundary:
            progress.count_step(False, 0)
            return
        if self._config.managed_gradient_accumulation:
            samples = self.train_batch_size()
        else:
            samples = progress.micro_batches_in_step() * self.train_micro_batch_size_per_gpu() * self.dp_world_size
        progress.count_step(True, samples)
        self.reporter.after_step(optimizer, self.basic_optimizer)
        if self._hybrid is not None:
            self._hybrid.stepped()

    def train(self, mode: bool = True) -> DeepSpeedEngine:
        """Training mode (eval(): generation mode); with the Hybrid Engine, eval() reports the last
        iteration's latency split (generate, gather, training, other) as DeepSpeed prints it."""
        super().train(mode)
        hybrid = self.__dict__.get("_hybrid")
        if hybrid is not None:
            hybrid.mode_changed(mode, self.reporter.monitor, self.global_samples)
        return self

    def generate(self, *inputs: Any, **kwargs: Any) -> Any:
        """The module's generate(); with the Hybrid Engine, its generation (weights gathered once at ZeRO-3,
        tensor-parallel with inference_tp_size, LoRA fused)."""
        return self.module.generate(*inputs, **kwargs)

    def zero_grad(self) -> None:
        """Drop the accumulated gradients (step() already does this at each boundary)."""
        if self.optimizer is not None:
            self.optimizer.zero_grad()

    # ------------------------------------------------------------------ accessors (the rest: accessors.py)
    def get_type(self) -> type:
        return type(self.module)

    def get_sequence_parallel_group(self) -> Any:
        """The ranks splitting each sample's sequence (None without sequence_parallel_size), as DeepSpeed's."""
        return self.seq_parallel_group

    def compile(self, backend: str = "inductor", compile_kwargs: dict | None = None, schedule: Any = None) -> None:
        """torch.compile the wrapped module in place (DeepSpeed's engine.compile). With compile.deepcompile,
        ZeRO's collectives go into the graphs (dscompile; schedule: [(step, [pass names])]); without it, a
        plain torch.compile with the hooks attached. A second call does nothing."""
        if self._compiled:
            return
        if self._config.compile.deepcompile:
            from ..wiring.dscompile import compile_deepcompile

            self.deepcompile_runtime = compile_deepcompile(self, backend, compile_kwargs, schedule)
        elif schedule is not None:
            raise DstrainError("engine.compile(schedule=...) schedules DeepCompile's passes: set "
                               "\"compile\": {\"deepcompile\": true} in the config")
        else:
            self.module.compile(backend=backend, **(compile_kwargs or {}))
        self._compiled = True

    def destroy(self) -> None:
        if self.deepcompile_runtime is not None:
            from ..wiring.dscompile import uncompile

            uncompile(self.deepcompile_runtime)
        super().destroy()

    @property
    def is_compiled(self) -> bool:
        return self._compiled

    def collect_python_gc(self) -> int:
        """Run the cyclic garbage collector by hand (with disable_python_gc it never runs on its own)."""
        return gc.collect()

    def __getattr__(self, name: str) -> Any:
        # As DeepSpeed's engine: attributes it lacks are looked up on the wrapped module.
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self._modules.get("module")
            if module is not None and hasattr(module, name):
                return getattr(module, name)
            if name.startswith("_") and name not in _DEEPSPEED_PRIVATE_API:
                raise  # a probe of a private name (torch, Accelerate): no message to build
            from ..compat.callers import missing

            raise AttributeError(f"'DeepSpeedEngine' object has no attribute {name!r} (nor has its module "
                                 f"{type(module).__name__}): {missing(f'engine.{name}')}") from None

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False) -> bool:
        """Save the training state under `save_dir/<tag>` (collective); exclude_frozen_parameters leaves
        the parameters with requires_grad False out of the module file."""
        from ..checkpoint import save_checkpoint

        self._require_optimizer("save_checkpoint")
        return save_checkpoint(self._parts, save_dir, tag, client_state or {}, save_latest,
                               exclude_frozen_parameters=exclude_frozen_parameters)

    def _copy_recovery_script(self, save_path) -> None:
        """DeepSpeed's name: write zero_to_fp32.py into `save_path` (a ZeRO save does it itself)."""
        from ..checkpoint.recovery_script import write_recovery_script

        write_recovery_script(save_path)

    def _change_recovery_script_permissions(self, dst) -> None:
        """DeepSpeed's name: make the recovery script executable, logging (not raising) where that is refused."""
        from ..checkpoint.recovery_script import make_executable

        make_executable(dst)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False,
                        custom_load_fn=None) -> tuple[str | None, Any]:
        """Load a checkpoint (collective): (its path, the client state), or (None, None) when there is none.
        custom_load_fn(src=<saved module state>, dst=<module>) replaces the module's own loading."""
        from ..checkpoint import load_checkpoint

        return load_checkpoint(self._parts, load_dir, tag, load_module_strict=load_module_strict,
                               load_optimizer_states=load_optimizer_states,
                               load_lr_scheduler_states=load_lr_scheduler_states, load_module_only=load_module_only,
                               custom_load_fn=custom_load_fn)

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """The module's weights in its training dtype as one file, written by the first data-parallel rank."""
        from ..checkpoint import save_16bit_model

        return save_16bit_model(self._parts, save_dir, save_filename,
                                exclude_frozen_parameters=exclude_frozen_parameters)

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        """Whether the config lets a stage-3 run gather its weights to save them whole
        (zero_optimization.stage3_gather_16bit_weights_on_model_save)."""
        return bool(self._config.zero_optimization.stage3_gather_16bit_weights_on_model_save)

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> dict | None:
        """The whole module's state dict in its training dtype on global rank 0 (None on the others; every rank
        calls it). DeepSpeed's name, which Hugging Face's Trainer and Accelerate call; stage 3 only, as there."""
        from .consolidated import consolidated_state_dict

        if self.zero_optimization_stage() != 3:
            raise ValueError(f"_zero3_consolidated_16bit_state_dict needs ZeRO stage 3 (zero_optimization.stage is "
                             f"{self.zero_optimization_stage()}); the module's own state_dict() is whole here")
        return consolidated_state_dict(self.module, exclude_frozen_parameters)

    def _consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> dict | None:
        """DeepSpeed's name, which Accelerate's get_state_dict calls: the whole module's state dict in its training
        dtype where the weights are partitioned, ZeRO-3's shards (on global rank 0) or AutoTP's tensor-parallel
        shards merged (on global rank 0); None on the other ranks, which must all call it."""
        if self.zero_optimization_stage() == 3:
            return self._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters)
        if self._config.tensor_parallel.autotp_size > 1:
            from ..checkpoint.sixteen_bit import whole_16bit_state_dict

            return whole_16bit_state_dict(self._parts, exclude_frozen_parameters=exclude_frozen_parameters)
        raise ValueError("_consolidated_16bit_state_dict needs partitioned weights: ZeRO stage 3 or "
                         "tensor_parallel.autotp_size > 1 (here the module's own state_dict() is whole)")

    # ------------------------------------------------------------------ data efficiency (dsdata)
    def set_data_post_process_func(self, post_process_func) -> None:
        """fn(batch, sampler_state) -> batch, applied to each batch of the curriculum loader (e.g. dsdata's
        seqlen_post_process cuts the sequences to the current difficulty)."""
        from ..wiring.dsdata import set_data_post_process_func

        set_data_post_process_func(self._parts, post_process_func)

    def set_custom_curriculum_learning_schedule(self, schedule_func_dict: dict) -> None:
        """{metric: fn(global_step) -> difficulty} for the curriculum metrics whose schedule_type is custom."""
        from ..wiring.dsdata import set_custom_curriculum_learning_schedule

        set_custom_curriculum_learning_schedule(self._parts, schedule_func_dict)

    @property
    def random_ltd_scheduler(self) -> Any:
        """The run's random-LTD schedule and token counts (dsdata.RandomLTDScheduler), None when it is off."""
        from ..wiring.dsdata import random_ltd_scheduler

        return random_ltd_scheduler(self._parts)

    def random_ltd_initialize(self) -> None:
        """Give the module's random-LTD layers the config's schedule (dstrain.convert_to_random_ltd calls it)."""
        from ..wiring.dsdata import random_ltd_initialize

        random_ltd_initialize(self._parts, self.module)

    # ------------------------------------------------------------------ the rest
    def _state_text(self) -> str:
        import json

        return "engine config:\n" + json.dumps(self.config, indent=2, sort_keys=True, default=str)

    def offload_states(self, include: Any = None, device: str = "cpu", pin_memory: bool = True,
                       non_blocking: bool = False) -> None:
        """Move optimizer states and master weights to host memory until reload_states() (DeepSpeed's API)."""
        self._require_optimizer("offload_states")
        self.optimizer.offload_states(include, str(getattr(device, "value", device)), pin_memory, non_blocking)

    def reload_states(self, non_blocking: bool = False) -> None:
        self._require_optimizer("reload_states")
        self.optimizer.reload_states(non_blocking)


def _hook_outputs(output: Any, hook) -> None:
    if torch.is_tensor(output):
        if output.requires_grad:
            output.register_hook(hook)
    elif isinstance(output, (list, tuple)):
        for item in output:
            _hook_outputs(item, hook)
    elif isinstance(output, dict):
        for item in output.values():
            _hook_outputs(item, hook)
