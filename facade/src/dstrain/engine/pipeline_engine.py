"""`PipelineEngine`: a dspipe PipelineModule trained by a pipeline schedule, as DeepSpeed's
`deepspeed.runtime.pipe.PipelineEngine` presents it (`train_batch`, `eval_batch`, ...).

A sibling of DeepSpeedEngine, built from the same parts (`parts.build_training_parts`: precision,
the ZeRO optimizer over this stage's data-parallel group with the norm group spanning every stage,
scheduler, loader, progress, reporter), saved by `checkpoint/` (per-layer files, a directory per
stage). dspipe's runtime runs the schedule; the ZeRO optimizer fills its gradient-sync seam (sync held back over the batch's backward
passes, tied gradients summed across stages, one reduction, then the step).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dscomm import watchdog
from dsconfig import ConfigError, DeepSpeedConfig, Problem
from dsmonitor import events

from ..wiring.optional_libs import require

try:  # dspipe is an optional library: name its install, not a stack
    from dspipe import PipelineError, PipelineModule, ScheduleError
    from dspipe.runtime import PipelineRuntime
except ModuleNotFoundError:
    require("dspipe", "dstrain.PipelineEngine (pipeline parallelism)")
    raise

from ..errors import DstrainError
from ..logs import log_on_rank0
from ..wiring.dspipe import choose_schedule, refuse_zero_stage_3
from .accessors import EngineAccessors
from .dataloader import RepeatingLoader
from .parts import build_training_parts

ONLY_TRAIN_BATCH = "Only train_batch() is accessible in pipeline mode."


class _ZeroSeam:
    """The parts' ZeRO optimizer as dspipe's GradientSync; step() also steps the scheduler and counters."""

    def __init__(self, engine: PipelineEngine):
        self.engine = engine

    @property
    def backward_scale(self) -> float:
        return self.engine.optimizer.backward_scale

    def require_gradient_sync(self, enabled: bool) -> None:
        self.engine.optimizer.require_gradient_sync(enabled)

    def finish_backward(self) -> None:
        self.engine.optimizer.finish_backward()

    def step(self) -> bool:
        return self.engine._optimizer_step()


class PipelineEngine(EngineAccessors, torch.nn.Module):
    """Built by `dstrain.initialize(model=PipelineModule(...))`; `loss = engine.train_batch()`."""

    pipeline_parallelism = True  # DeepSpeed's flag

    def __init__(self, *, model: PipelineModule, config: DeepSpeedConfig, optimizer: Any = None,
                 model_parameters: Any = None, training_data: Any = None, lr_scheduler: Any = None,
                 collate_fn: Any = None, data_parallel_group: Any = None, groups: Any = None,
                 step_hooks: list | None = None):
        super().__init__()
        if not isinstance(model, PipelineModule):
            raise DstrainError(f"PipelineEngine trains a dspipe PipelineModule, got {type(model).__name__}")
        refuse_zero_stage_3(config)
        if config.hybrid_engine.enabled:
            raise ConfigError(Problem("hybrid_engine.enabled", "the Hybrid Engine generates with a whole model's "
                                      "generate(), which a PipelineModule's stages are not: train the actor "
                                      "without a pipeline", True))
        schedule = choose_schedule(config, model)
        parts = build_training_parts(model, config, optimizer=optimizer, model_parameters=model_parameters,
                                     training_data=training_data, lr_scheduler=lr_scheduler, collate_fn=collate_fn,
                                     data_parallel_group=data_parallel_group, groups=groups, step_hooks=step_hooks)
        self.adopt_parts(parts, config, model)
        self.groups = groups
        self.num_stages = model.num_stages
        self.stage_id = model.stage_id
        self.micro_batches = config.gradient_accumulation_steps
        self.micro_batch_size = config.train_micro_batch_size_per_gpu
        self.schedule = schedule
        self.runtime = PipelineRuntime(model, groups, schedule, device=parts.device,
                                       input_hook=parts.precision.cast_inputs,
                                       forward_context=parts.precision.forward_context)
        try:  # a schedule that cannot run this many micro-batches says so now, not at the first batch
            self.runtime.program(self.micro_batches)
        except ScheduleError as exc:
            raise ConfigError(Problem("gradient_accumulation_steps", f"the {schedule} schedule: {exc}",
                                      self.micro_batches)) from None
        self._seam = _ZeroSeam(self)
        self.data_iterator: Any = None
        self.batch_fn: Any = None
        self.has_attention_mask = False
        self.agg_train_loss: torch.Tensor | None = None
        self._step_applied = False
        if parts.training_dataloader is not None:
            self.set_dataloader(RepeatingLoader(parts.training_dataloader))
        log_on_rank0(self.global_rank, f"pipeline engine ready: {self.num_stages} ranks x {model.placement.stages} "
                                       f"stages ({model.placement.shape}), schedule {schedule}, "
                                       f"{self.micro_batches} micro-batches of {self.micro_batch_size} x "
                                       f"{self.dp_world_size} data-parallel replica(s)")

    # ------------------------------------------------------------------ training
    def train_batch(self, data_iter: Any = None) -> torch.Tensor:
        """Forward and backward of gradient_accumulation_steps() micro-batches by the schedule, then the
        optimizer step; returns the batch's mean loss (averaged over the data-parallel replicas) on every rank."""
        self._require_optimizer("train_batch")
        if data_iter is not None:
            self.set_dataiterator(data_iter)
        started = time.perf_counter()
        timer = self.reporter.timer("step")
        timer.start()
        watchdog.record(f"pipeline train_batch of step {self.global_steps + 1}")  # dspipe records each action
        loss = self.runtime.train_batch(self._batches(), self._seam, self.micro_batches)
        timer.stop()
        self.agg_train_loss = loss
        progress = self._progress
        progress.last_step_applied = bool(self._step_applied)
        progress.micro_steps += self.micro_batches - 1  # count_step adds the last one
        progress.count_step(True, self.train_batch_size())
        self.reporter.record_loss(loss)
        self.reporter.after_step(self.optimizer, self.basic_optimizer)
        if self.global_steps % self.steps_per_print() == 0:
            seconds = time.perf_counter() - started
            log_on_rank0(self.global_rank, f"steps: {self.global_steps} loss: {loss.item():0.4f} iter time (s): "
                                           f"{seconds:0.3f} samples/sec: {self.train_batch_size() / seconds:0.3f}")
        return loss

    def _optimizer_step(self) -> bool:
        """The schedule's STEP: the ZeRO step, then the scheduler when the step was applied."""
        applied = self.optimizer.step()
        if applied and self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.optimizer.zero_grad()
        self._step_applied = applied
        return applied

    def eval_batch(self, data_iter: Any, return_logits: bool = False, compute_loss: bool = True,
                   reduce_output: str | None = "avg", bcast_loss: bool = True,
                   num_micro_batches: int | None = None) -> Any:
        """The forward pass of num_micro_batches (default: gradient_accumulation_steps()) micro-batches,
        without gradients: the mean loss on every rank (bcast_loss), or with return_logits (loss, outputs
        of the last micro-batch, on the last stage)."""
        saved = self.data_iterator
        self.set_dataiterator(data_iter)
        micro = self.micro_batches if num_micro_batches is None else num_micro_batches
        try:
            with torch.no_grad():
                result = self.runtime.eval_batch(self._batches(), micro, compute_loss=compute_loss,
                                                 reduce_output=reduce_output, bcast_loss=bcast_loss,
                                                 return_logits=return_logits)
        finally:
            self.data_iterator = saved
        loss = result[0] if return_logits else result
        if self.reporter.monitor.enabled and torch.is_tensor(loss):
            self.reporter.monitor.write_events([(events.EVAL_LOSS, loss.mean().item(), self.global_samples)])
        return result

    def _batches(self) -> Any:
        iterator = self.data_iterator
        if iterator is None or self.batch_fn is None:
            return iterator
        return (self.batch_fn(batch) for batch in iterator)

    # ------------------------------------------------------------------ DeepSpeed's pipeline methods
    def is_first_stage(self) -> bool:
        return self.module.placement.first_stage_rank == self.stage_id

    def is_last_stage(self) -> bool:
        """Whether this rank computes the loss (rank 0 for a DualPipeVModule)."""
        return self.module.placement.last_stage_rank == self.stage_id

    def get_pipeline_parallel_rank(self) -> int:
        return self.stage_id

    def set_dataloader(self, loader: Any) -> None:
        if self.is_first_stage() or self.is_last_stage():
            self.data_iterator = iter(loader)

    def set_dataiterator(self, iterator: Any) -> None:
        if self.is_first_stage() or self.is_last_stage():
            self.data_iterator = iterator

    def set_batch_fn(self, fn: Any) -> None:
        """fn(batch) -> batch, applied to every micro-batch pulled from the data iterator."""
        self.batch_fn = fn

    def set_has_attention_mask(self, value: bool) -> None:
        self.has_attention_mask = bool(value)  # tensors of any dtype travel between stages here

    @contextlib.contextmanager
    def tracing(self, directory: Any) -> Iterator[None]:
        """Record every pipeline action this rank runs inside the block and write them, when it ends, to
        `directory/pipe_trace_rankNNNNN.json` (dspipe's trace format: `dspipe show --from-trace <files>`
        draws the measured timeline)."""
        path = Path(directory) / f"pipe_trace_rank{self.global_rank:05d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.runtime.tracing() as recorder:
            yield
        self.runtime.write_trace(path, recorder)

    def reset_activation_shape(self) -> None:
        """Exchange the activation shapes again (call it on every rank when they change without dynamic_shape)."""
        self.runtime.reset_activation_shape()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise PipelineError(f"{ONLY_TRAIN_BATCH} engine(...) runs no pipeline: call engine.train_batch() (or "
                            f"engine.eval_batch(data_iter))")

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        raise PipelineError(f"{ONLY_TRAIN_BATCH} train_batch() runs the backward passes of its schedule")

    def step(self, *args: Any, **kwargs: Any) -> Any:
        raise PipelineError(f"{ONLY_TRAIN_BATCH} train_batch() ends with the optimizer step")

    # ------------------------------------------------------------------ accessors (the rest: accessors.py)
    def is_gradient_accumulation_boundary(self) -> bool:
        return True  # every train_batch ends with a step

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False) -> bool:
        """Save under `save_dir/<tag>` (collective over every rank): one file per layer (DeepSpeed's
        `layer_XX-model_states`), each stage's ZeRO shards, the scheduler and counters."""
        from ..checkpoint import save_checkpoint

        self._require_optimizer("save_checkpoint")
        return save_checkpoint(self._parts, save_dir, tag, client_state or {}, save_latest,
                               exclude_frozen_parameters=exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False,
                        custom_load_fn=None) -> tuple[str | None, Any]:
        """Load a checkpoint (collective), saved at any number of stages: weights, the optimizer's state
        (its masters and moments), scheduler and counters."""
        from ..checkpoint import load_checkpoint

        if custom_load_fn is not None:
            raise DstrainError("load_checkpoint(custom_load_fn=...) is not supported with a PipelineModule (its "
                               "weights are stored per layer): load without it")
        return load_checkpoint(self._parts, load_dir, tag, load_module_strict=load_module_strict,
                               load_optimizer_states=load_optimizer_states,
                               load_lr_scheduler_states=load_lr_scheduler_states, load_module_only=load_module_only)

    def module_state_dict(self, exclude_frozen_parameters: bool = False) -> dict[str, torch.Tensor]:
        """This rank's layers' weights (a pipeline's full model is spread over its ranks)."""
        return {k: v for k, v in self.module.state_dict().items()}
