"""Autotuning, activation checkpointing, checkpoint files, compiler passes and the rank watchdog."""

from typing import Literal

import attrs

from ..fields import section, setting


@attrs.frozen
class AutotuningConfig:
    enabled: bool = setting(False, "Enable the autotuner.")
    results_dir: str = setting("autotuning_results", "Directory of the experiment results.")
    exps_dir: str = setting("autotuning_exps", "Directory of the experiment descriptions.")
    overwrite: bool = setting(False, "Re-run experiments whose results exist.")
    metric: Literal["latency", "throughput", "flops"] = setting("throughput", "Metric that ranks experiments.")
    start_profile_step: int = setting(3, "Step at which profiling starts.", ge=0)
    end_profile_step: int = setting(5, "Step at which profiling ends; not less than start_profile_step.", ge=0)
    fast: bool = setting(True, "Tune only ZeRO stages and micro-batch sizes.")
    max_train_batch_size: int | None = setting(None, "Largest global batch size to try.", ge=1)
    mp_size: int = setting(1, "Model-parallel degree.", ge=1)
    num_tuning_micro_batch_sizes: int = setting(3, "Micro-batch sizes to explore.", ge=1)
    tuner_type: Literal["model_based", "gridsearch", "random"] = setting("model_based", "Order of exploration.")
    tuner_early_stopping: int = setting(5, "Experiments beyond the best before stopping.", ge=1)
    tuner_num_trials: int = setting(50, "Most experiments per ZeRO stage.", ge=1)
    arg_mappings: dict[str, str] | None = setting(None, "Config key -> training-script argument it maps to.")


@attrs.frozen
class ActivationCheckpointingConfig:
    partition_activations: bool = setting(False, "Partition checkpointed activations over model parallelism.")
    cpu_checkpointing: bool = setting(False, "Offload checkpointed activations to the CPU.")
    contiguous_memory_optimization: bool = setting(False, "Copy partitioned activations into contiguous memory.")
    number_checkpoints: int | None = setting(None, "Checkpoints for contiguous_memory_optimization's buffer.", ge=1)
    synchronize_checkpoint_boundary: bool = setting(False, "Synchronise the device at each checkpoint boundary.")
    profile: bool = setting(False, "Log forward/backward time of each checkpointed function.")


@attrs.frozen
class CheckpointParallelWriteConfig:
    pipeline_stage: bool = setting(False, "Parallelise checkpoint writes over pipeline stages.")


@attrs.frozen
class CheckpointConfig:
    tag_validation: Literal["Ignore", "Warn", "Fail"] = setting("Warn", "Check that tags agree across ranks.")
    load_universal: bool = setting(False, "Load a universal checkpoint.")
    use_node_local_storage: bool = setting(False, "Store checkpoints by local rank (no shared file system needed).")
    parallel_write: CheckpointParallelWriteConfig = section(CheckpointParallelWriteConfig, "Parallel writing.")


@attrs.frozen
class CompileConfig:
    deepcompile: bool = setting(False, "Enable DeepCompile: ZeRO's collectives scheduled by the compiler.")
    passes: list[Literal["z1", "z3", "autosp", "autotp", "long_context_checkpointing"]] = section(
        list, "Compiler passes to apply (long_context_checkpointing: recompute sequence-long activations, keep "
              "attention; beside autosp or the ZeRO passes).")
    free_activation: bool = setting(False, "Free activations in backward right after their last use.")
    free_activation_threshold: int = setting(10 * 1024 * 1024, "Bytes from which free_activation frees one.",
                                             ge=0)
    offload_activation: bool = setting(False, "DeepCompile activation offload (needs a custom schedule).")
    offload_activation_pin_memory: bool = setting(True, "Pin host buffers of activation offload.")
    offload_opt_states: bool = setting(False, "Move optimizer states to host memory during forward/backward.")
    offload_parameters: bool = setting(False, "Move parameter shards to host memory between their uses.")
    double_buffer: bool = setting(True, "Reduce gradients through two alternating buffers (overlap).")
    debug_log: bool = setting(False, "Log every graph before and after the passes (rank 0).")
    sync_before_reduce: bool = setting(False, "Synchronise before each gradient reduction.")
    sync_after_reduce: bool = setting(False, "Synchronise after each gradient reduction.")
    sync_before_allgather: bool = setting(False, "Synchronise before each parameter all-gather.")
    sync_after_allgather: bool = setting(False, "Synchronise after each parameter all-gather.")
    keep_int_input_tensors: bool = setting(True, "The profiling run keeps integer graph inputs' real values.")
    keep_all_input_tensors: bool = setting(False, "The profiling run keeps every graph input's real values.")


@attrs.frozen
class RankWatchdogConfig:
    """dstrain's own section (DeepSpeed has none): dscomm's watchdog for ranks that stop answering."""

    enabled: bool = setting(True, "Watch every rank's heartbeat; a silent one is named and the job ends.")
    timeout: float = setting(240.0, "Seconds without a heartbeat before a rank is named as stopped, on every rank, "
                                    "and the job ends (exit code 75); the process group's timeout is unchanged.",
                             gt=0)
