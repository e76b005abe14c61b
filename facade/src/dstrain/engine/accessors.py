"""What both engines answer the same way, read from their parts: DeepSpeed's accessors
(`train_batch_size()`, `get_lr()`, `loss_scale`, ...), the replaceable parts (`optimizer`,
`lr_scheduler`, `training_dataloader`), the step counters, `deepspeed_io` and `destroy`.

`DeepSpeedEngine` and `PipelineEngine` each mix this in beside torch.nn.Module and drive their own
loop; neither subclasses the other. `adopt_parts` is the part of their `__init__` they share."""

from __future__ import annotations

from typing import Any

import torch

import dscomm
from dsconfig import DeepSpeedConfig

from ..errors import DstrainError
from .dataloader import DeepSpeedDataLoader
from .parts import TrainingParts, gradient_clipping_of
from .step_reporting import learning_rates, momenta


def _part(name: str, doc: str) -> property:
    # Readable and writable, as on DeepSpeed's engine; the parts hold the value so checkpoints see a replacement.
    return property(lambda self: getattr(self._parts, name), lambda self, value: setattr(self._parts, name, value),
                    doc=doc)


def _counter(name: str, doc: str) -> property:
    return property(lambda self: getattr(self._progress, name),
                    lambda self, value: setattr(self._progress, name, int(value)), doc=doc)


class EngineAccessors:
    """Accessors over `self._parts` (a TrainingParts) and `self._config` (the typed config)."""

    _parts: TrainingParts
    _config: DeepSpeedConfig

    optimizer = _part("optimizer", "The ZeRO optimizer wrapping the basic one (None without an optimizer).")
    basic_optimizer = _part("basic_optimizer", "The torch optimizer whose parameter groups hold lr and betas.")
    lr_scheduler = _part("lr_scheduler", "The learning-rate scheduler, stepped at each applied optimizer step.")
    training_dataloader = _part("training_dataloader", "The loader over initialize(training_data=...), or None.")
    global_steps = _counter("global_steps", "Optimizer steps taken (applied or skipped for an fp16 overflow).")
    global_samples = _counter("global_samples", "Samples consumed by those steps, over all data-parallel ranks.")
    micro_steps = _counter("micro_steps", "Micro-batches trained (engine.step() calls, boundary or not).")

    def adopt_parts(self, parts: TrainingParts, config: DeepSpeedConfig, model: torch.nn.Module) -> None:
        """The attributes DeepSpeed's engines expose, from the parts (call after nn.Module.__init__)."""
        self._parts = parts
        self._progress = parts.progress
        self._config = config
        self.config = config.to_dict()  # the resolved config as JSON data, as DeepSpeed's engine.config
        self.module = model
        if config.rank_watchdog.enabled:  # a rank that stops answering is named and the job ends (dscomm.watchdog)
            dscomm.watchdog.start(config.rank_watchdog.timeout)
        self.global_rank = parts.global_rank
        self.world_size = dscomm.get_world_size()
        self.local_rank = dscomm.get_local_rank()
        # DeepSpeed's names: dp_world_size counts data-parallel replicas (the batch size's factor);
        # seq_dp_world_size the ranks ZeRO spans (sequence x data); equal without sequence parallelism.
        self.dp_world_size = parts.data_world_size
        self.seq_dp_world_size = parts.dp_world_size
        self.sequence_parallel_size = parts.sequence_parallel_size
        self.device = parts.device
        self.precision = parts.precision
        self.reporter = parts.reporter
        if self.reporter.profiler is not None:
            self.reporter.profiler.ds_engine = self  # its printed profile names this engine's layout

    def deepspeed_io(self, dataset: Any, batch_size: int | None = None, route: str = "train", collate_fn: Any = None,
                     num_workers: int = 0, data_sampler: Any = None) -> DeepSpeedDataLoader:
        """A distributed loader over `dataset` (DeepSpeed's name), e.g. for evaluation data."""
        return DeepSpeedDataLoader(dataset, batch_size or self.train_micro_batch_size_per_gpu(),
                                   rank=self._parts.data_rank, world_size=self.dp_world_size, collate_fn=collate_fn,
                                   num_workers=num_workers, data_sampler=data_sampler, shuffle=route == "train",
                                   drop_last=self._config.dataloader_drop_last)

    def _require_optimizer(self, what: str) -> None:
        if self.optimizer is None:
            raise DstrainError(f"engine.{what}() needs an optimizer: add an \"optimizer\" section to the config or "
                               f"pass optimizer= to initialize()")

    def train_batch_size(self) -> int:
        return self._config.train_batch_size

    @property
    def tput_timer(self) -> Any:
        """Samples per second over the steps after warm-up (dsmonitor.ThroughputTimer, DeepSpeed's name)."""
        return self.reporter.throughput

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._config.gradient_accumulation_steps

    def elasticity_enabled(self) -> bool:
        """Whether the config's `elasticity` section picked the batch triple for this data-parallel size."""
        return self._config.elasticity.enabled

    def is_elastic_model_parallel_supported(self) -> bool:
        """Whether the elastic config's model replicas fit its nodes (num_gpus_per_node a multiple of
        model_parallel_size); initialize() refuses an elastic run whose replicas are another width."""
        elastic = self._config.elasticity
        return elastic.enabled and elastic.num_gpus_per_node % elastic.model_parallel_size == 0

    def was_step_applied(self) -> bool:
        """False when the last boundary step was skipped for an fp16 overflow (or no boundary was reached)."""
        return self._progress.last_step_applied

    def zero_optimization_stage(self) -> int:
        return self._config.zero_optimization.stage

    def zero_optimization(self) -> bool:
        return self._config.zero_optimization.stage > 0

    def autotp_size(self) -> int:
        """The config's `tensor_parallel.autotp_size`: over how many ranks AutoTP splits the model."""
        return self._config.tensor_parallel.autotp_size

    def fp16_enabled(self) -> bool:
        return self.precision.fp16

    def bfloat16_enabled(self) -> bool:
        return self.precision.bf16

    def gradient_clipping(self) -> float:
        return gradient_clipping_of(self._config)  # the config's, as DeepSpeed's engine answers

    def steps_per_print(self) -> int:
        return self._config.steps_per_print

    def log_level(self) -> str | None:
        """The config's `log_level` as written (None: unset, the logger's level left as it was)."""
        return self._config.log_level

    @property
    def loss_scale(self) -> float:
        return self.optimizer.loss_scale if self.optimizer is not None else 1.0

    @property
    def sparse_tensor_module_names(self) -> set[str]:
        """The parameters whose gradients are reduced as sparse tensors (DeepSpeed's sparse_gradients): none,
        that config key is not part of dstrain (refused by name), so every gradient is reduced dense."""
        return set()

    def empty_partition_cache(self) -> None:
        """Release the ZeRO-3 parameters left gathered (the forward's, the prefetch's), between steps; nothing to
        release below stage 3 (pipelines run at stages 0-1)."""
        if self.optimizer is not None:
            self.optimizer.empty_partition_cache()

    def _get_optimizer_ckpt_name(self, checkpoints_path: Any, tag: Any, expp_rank: int = 0) -> str:
        """The file of the checkpoint `checkpoints_path/tag` that holds this rank's optimizer state: its ZeRO
        shard (DeepSpeed's private name, which its tests patch to see a load read no optimizer state). Experts'
        state is in the same shard, so `expp_rank` (DeepSpeed's per-expert-rank file) changes nothing."""
        from pathlib import Path

        import dszero.checkpoint

        from ..checkpoint.files import ZERO_DIR
        from ..checkpoint.layout import RunLayout

        if self.optimizer is None:
            raise DstrainError("_get_optimizer_ckpt_name: this engine has no optimizer, so no optimizer state")
        directory = RunLayout.of(self._parts).shard_directory(Path(checkpoints_path) / str(tag)) / ZERO_DIR
        return str(dszero.checkpoint.shard_path(self.optimizer, directory))

    @property
    def flops_profiler(self) -> Any:
        """DeepSpeed's engine.flops_profiler: dsmonitor's FlopsProfiler when the `flops_profiler` section is
        enabled (after the profiled step, its `flops` / `macs` / `params` are the totals it printed), else None."""
        return self.reporter.profiler

    @property
    def skipped_steps(self) -> int:
        return self.optimizer.skipped_steps if self.optimizer is not None else 0

    def get_lr(self) -> list[float]:
        return learning_rates(self.basic_optimizer)

    def get_mom(self) -> list[Any]:
        return momenta(self.basic_optimizer)

    def get_global_grad_norm(self) -> float | None:
        return self.optimizer.get_global_grad_norm() if self.optimizer is not None else None

    def destroy(self) -> None:
        """Close the monitors and give the garbage collector back."""
        self._parts.close()
