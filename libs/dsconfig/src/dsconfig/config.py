"""`DeepSpeedConfig`: the whole ds_config.json, one attribute per top-level key."""

import typing
from typing import Any, Literal

import attrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from .converter import CONVERTER
from .elasticity import ElasticityConfig
from .fields import AUTO, Auto, info, section, setting
from .sections import (
    ActivationCheckpointingConfig,
    AioConfig,
    AutotuningConfig,
    BF16Config,
    CheckpointConfig,
    CometConfig,
    CommsLoggerConfig,
    CompileConfig,
    CSVMonitorConfig,
    DataEfficiencyConfig,
    DataTypesConfig,
    ExpertParallelConfig,
    FlopsProfilerConfig,
    FP16Config,
    HybridEngineConfig,
    LegacyCurriculumConfig,
    OptimizerConfig,
    PipelineConfig,
    RankWatchdogConfig,
    SchedulerConfig,
    TensorBoardConfig,
    TensorParallelConfig,
    TorchAutocastConfig,
    WandbConfig,
    ZeroConfig,
)

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@attrs.frozen
class DeepSpeedConfig:
    # Batch size: train_batch_size = micro batch * accumulation steps * data-parallel size.
    train_batch_size: int | Auto = setting(AUTO, "Samples per optimizer step, over all data-parallel ranks.", ge=1)
    train_micro_batch_size_per_gpu: int | Auto = setting(AUTO, "Samples per rank per forward/backward.", ge=1)
    gradient_accumulation_steps: int | Auto = setting(AUTO, "Micro-batches accumulated per optimizer step.", ge=1)
    managed_gradient_accumulation: bool = setting(
        True, "Track micro-steps and step the optimizer only at the accumulation boundary.")

    optimizer: OptimizerConfig | None = setting(None, "Optimizer built from the config; null uses the client's.")
    scheduler: SchedulerConfig | None = setting(None, "Learning-rate scheduler built from the config.")

    communication_data_type: Literal["fp32", "fp16", "bf16"] | None = setting(
        None, "Data type of gradient communication; null follows the training precision.")
    gradient_allreduce_op: Literal["mean", "sum"] = setting("mean", "Average (mean) or sum gradients over ranks.")
    prescale_gradients: bool = setting(False, "Scale gradients before the mean allreduce.")
    gradient_predivide_factor: float = setting(1.0, "Divide gradients by this before the mean allreduce.", gt=0)

    fp16: FP16Config = section(FP16Config, "FP16 mixed precision with loss scaling.")
    bf16: BF16Config = section(BF16Config, "bfloat16 training.")
    torch_autocast: TorchAutocastConfig = section(TorchAutocastConfig, "PyTorch's torch.autocast.")
    gradient_clipping: float | Auto = setting(1.0, "Clip the global gradient norm to this value; 0 disables.", ge=0)

    zero_optimization: ZeroConfig = section(ZeroConfig, "ZeRO memory optimisations.")
    aio: AioConfig = section(AioConfig, "Asynchronous I/O for NVMe offload.")
    tensor_parallel: TensorParallelConfig = section(TensorParallelConfig, "AutoTP tensor parallelism.")
    hybrid_engine: HybridEngineConfig = section(HybridEngineConfig, "Hybrid training/inference engine.")
    expert_parallel: ExpertParallelConfig = section(ExpertParallelConfig, "AutoEP expert parallelism.")
    pipeline: PipelineConfig = section(PipelineConfig, "Pipeline-parallel engine settings.")
    sequence_parallel_size: int = setting(
        1, "Ranks that split each sample's sequence (Ulysses); the batch size counts data-parallel ranks only.", ge=1)
    seq_parallel_communication_data_type: Literal["fp32", "fp16", "bf16"] = setting(
        "fp32", "Data type of gradient communication when sequence_parallel_size > 1 (replaces "
                "communication_data_type then, as in DeepSpeed).")

    disable_python_gc: bool = setting(False, "Disable Python's cyclic GC while the engine lives.")
    steps_per_print: int = setting(10, "Print a progress report every N steps.", ge=1)
    wall_clock_breakdown: bool = setting(False, "Time forward, backward and step.")
    dump_state: bool = setting(False, "Print the engine's state after initialisation.")
    log_level: str | None = setting(
        None, "Level of the engine's log (debug, info, warning, error or critical, any case); unset leaves it as is.")
    dataloader_drop_last: bool = setting(False, "Drop the last incomplete batch of the engine's data loader.")

    autotuning: AutotuningConfig = section(AutotuningConfig, "The autotuner.")
    flops_profiler: FlopsProfilerConfig = section(FlopsProfilerConfig, "The flops profiler.")
    activation_checkpointing: ActivationCheckpointingConfig = section(
        ActivationCheckpointingConfig, "Activation checkpointing.")
    data_efficiency: DataEfficiencyConfig = section(DataEfficiencyConfig, "Curriculum learning and random-LTD.")
    curriculum_learning: LegacyCurriculumConfig = section(
        LegacyCurriculumConfig, "The legacy sequence-length curriculum (before data_efficiency).")

    tensorboard: TensorBoardConfig = section(TensorBoardConfig, "TensorBoard monitor.")
    wandb: WandbConfig = section(WandbConfig, "Weights & Biases monitor.")
    comet: CometConfig = section(CometConfig, "Comet monitor.")
    csv_monitor: CSVMonitorConfig = section(CSVMonitorConfig, "CSV monitor.")
    comms_logger: CommsLoggerConfig = section(CommsLoggerConfig, "Communication logging.")

    rank_watchdog: RankWatchdogConfig = section(
        RankWatchdogConfig, "dstrain's own: name a rank that stops answering and end the job (dscomm.watchdog).")

    checkpoint: CheckpointConfig = section(CheckpointConfig, "Checkpoint options.")
    compile: CompileConfig = section(CompileConfig, "DeepCompile compiler passes.")
    data_types: DataTypesConfig = section(DataTypesConfig, "Data types.")

    # ------------------------------------------------------------------ views
    def to_dict(self) -> dict[str, Any]:
        """The full resolved config as plain JSON data; `load(cfg.to_dict()) == cfg`."""
        data = CONVERTER.unstructure(self)
        if self.elasticity.enabled:  # its batch keys are the ones elasticity picked, which load accepts again
            data["elasticity"] = self.elasticity.to_dict()
        return data

    def unresolved_auto(self) -> list[str]:
        """Dotted paths of every value still "auto" (batch sizes, HF-style placeholders)."""
        return sorted(_auto_paths(self, ""))

    def is_batch_resolved(self) -> bool:
        return all(isinstance(getattr(self, key), int) for key in BATCH_KEYS)

    def with_batch_size(self, train_batch_size: int | None = None, train_micro_batch_size_per_gpu: int | None = None,
                        gradient_accumulation_steps: int | None = None, *, world_size: int | None = None
                        ) -> "DeepSpeedConfig":
        """Complete the batch triple (e.g. from a launcher's arguments) at the data-parallel size of `load`.

        Values given here replace those of the config; "auto" ones left over are treated as
        absent, so the reference's defaults apply (gradient_accumulation_steps = 1). Raises
        ConfigError naming the keys when the triple is still undetermined or inconsistent.
        """
        from .batch import resolve_batch_triple

        given = {key: getattr(self, key) for key in BATCH_KEYS}
        overrides = zip(BATCH_KEYS, (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps))
        given.update({key: value for key, value in overrides if value is not None})
        known = {key: value for key, value in given.items() if value != AUTO}
        size = world_size if world_size is not None else self.data_parallel_size
        triple = resolve_batch_triple(known, explicit_auto=(), data_parallel_size=size, require=True)
        return attrs.evolve(self, **triple)

    # The `elasticity` section, read by `load` (dsconfig.elasticity validates it and picks the batch triple from it
    # at the data-parallel size); the other sections' machinery (key checks, docs, "auto") does not apply to it.
    elasticity: ElasticityConfig = attrs.field(factory=ElasticityConfig, kw_only=True,
                                               metadata={"dsconfig_internal": True})

    # The data-parallel size the batch triple was resolved at; set by `load`, not part of equality.
    data_parallel_size: int = attrs.field(default=1, eq=False, repr=False, kw_only=True,
                                          metadata={"dsconfig_internal": True})

    def enabled_features(self) -> list[str]:
        """Short names of what this config turns on, for `dsconfig check` and the engine's banner."""
        from .summary import enabled_features

        return enabled_features(self)


def _register_hooks() -> None:
    # data_parallel_size is bookkeeping of `load`, not a config key; `load` reads elasticity itself. Factories run
    # on first use, keeping cattrs' code generation out of `import dsconfig`.
    conv = CONVERTER.cattrs
    omit = override(omit=True)
    is_config = lambda tp: tp is DeepSpeedConfig  # noqa: E731
    conv.register_unstructure_hook_factory(
        is_config, lambda tp: make_dict_unstructure_fn(tp, conv, data_parallel_size=omit, elasticity=omit))
    conv.register_structure_hook_factory(
        is_config, lambda tp: make_dict_structure_fn(tp, conv, _cattrs_forbid_extra_keys=True,
                                                     _cattrs_detailed_validation=True, data_parallel_size=omit,
                                                     elasticity=omit))


_register_hooks()


def _auto_paths(obj: Any, path: str):
    """Placeholders: "auto" in a field typed `... | Auto` (not a mode), or anywhere in free-form params."""
    if attrs.has(type(obj)):
        for field in attrs.fields(type(obj)):
            if field.metadata.get("dsconfig_internal"):
                continue
            value = getattr(obj, field.name)
            where = f"{path}.{field.name}" if path else field.name
            if value == AUTO:
                if Auto in typing.get_args(field.type) and not info(field).auto_is_mode:
                    yield where
            else:
                yield from _auto_paths(value, where)
    elif isinstance(obj, dict):  # optimizer / scheduler params, curriculum metrics
        for key, value in obj.items():
            if value == AUTO:
                yield f"{path}.{key}"
            else:
                yield from _auto_paths(value, f"{path}.{key}")
