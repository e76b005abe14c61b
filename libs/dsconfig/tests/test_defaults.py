"""Every default the reference's tables give equals the loaded default (values transcribed by hand)."""

import pytest

import dsconfig

# (dotted path, the reference's default). Optional sections (offload_*) are read from a section
# written as {} so that their own defaults apply.
REFERENCE_DEFAULTS = [
    ("gradient_accumulation_steps", 1),  # resolved with a micro batch given, see the config below
    ("managed_gradient_accumulation", True),
    ("communication_data_type", None),
    ("gradient_allreduce_op", "mean"),
    ("prescale_gradients", False),
    ("gradient_predivide_factor", 1.0),
    ("fp16.enabled", False),
    ("fp16.auto_cast", False),
    ("fp16.loss_scale", 0.0),
    ("fp16.initial_scale_power", 16),
    ("fp16.loss_scale_window", 1000),
    ("fp16.hysteresis", 2),
    ("fp16.consecutive_hysteresis", False),
    ("fp16.min_loss_scale", 1),
    ("fp16.fp16_master_weights_and_grads", False),
    ("bf16.enabled", False),
    ("bf16.bf16_master_weights_and_grads", False),
    ("bf16.bf16_optimizer_states", False),
    ("torch_autocast.enabled", False),
    ("torch_autocast.dtype", "bfloat16"),
    ("torch_autocast.lower_precision_safe_modules",
     ["torch.nn.Linear", "torch.nn.Conv1d", "torch.nn.Conv2d", "torch.nn.Conv3d"]),
    ("gradient_clipping", 1.0),
    ("zero_optimization.stage", 0),
    ("zero_optimization.allgather_partitions", True),
    ("zero_optimization.allgather_bucket_size", 500_000_000),
    ("zero_optimization.compute_grad_norm", True),
    ("zero_optimization.overlap_comm", False),
    ("zero_optimization.reduce_scatter", True),
    ("zero_optimization.reduce_bucket_size", 500_000_000),
    ("zero_optimization.contiguous_gradients", True),
    ("zero_optimization.load_from_fp32_weights", True),
    ("zero_optimization.round_robin_gradients", False),
    ("zero_optimization.parameter_alignment", False),
    ("zero_optimization.stage3_max_live_parameters", 1_000_000_000),
    ("zero_optimization.stage3_max_reuse_distance", 1_000_000_000),
    ("zero_optimization.stage3_prefetch_bucket_size", 500_000_000),
    ("zero_optimization.stage3_param_persistence_threshold", 100_000),
    ("zero_optimization.sub_group_size", 1_000_000_000),
    ("zero_optimization.stage3_gather_16bit_weights_on_model_save", False),
    ("zero_optimization.stage3_module_granularity_threshold", 0),
    ("zero_optimization.zero_hpz_partition_size", 1),
    ("zero_optimization.zero_quantized_weights", False),
    ("zero_optimization.zero_quantized_gradients", False),
    ("zero_optimization.log_trace_cache_warnings", False),
    ("zero_optimization.ignore_unused_parameters", True),
    ("zero_optimization.offload_param.device", "cpu"),
    ("zero_optimization.offload_param.nvme_path", "/local_nvme"),
    ("zero_optimization.offload_param.pin_memory", True),
    ("zero_optimization.offload_param.buffer_count", 5),
    ("zero_optimization.offload_param.buffer_size", 100_000_000),
    ("zero_optimization.offload_param.max_in_cpu", 1_000_000_000),
    ("zero_optimization.offload_optimizer.device", "cpu"),
    ("zero_optimization.offload_optimizer.nvme_path", "/local_nvme"),
    ("zero_optimization.offload_optimizer.pin_memory", True),
    ("zero_optimization.offload_optimizer.ratio", 1),
    ("zero_optimization.offload_optimizer.buffer_count", 4),
    ("zero_optimization.offload_optimizer.fast_init", False),
    ("aio.block_size", 1048576),
    ("aio.queue_depth", 8),
    ("aio.thread_count", 1),
    ("aio.single_submit", False),
    ("aio.overlap_events", True),
    ("tensor_parallel.autotp_size", 0),
    ("tensor_parallel.preset_model", None),
    ("tensor_parallel.tp_overlap_comm", False),
    ("tensor_parallel.vocab_parallel_lm_head", False),
    ("tensor_parallel.partition_config", None),
    ("hybrid_engine.enable_cuda_graph", False),
    ("expert_parallel.enabled", False),
    ("expert_parallel.autoep_size", 1),
    ("expert_parallel.expert_tensor_parallel_size", 1),
    ("expert_parallel.async_split_plan", False),
    ("expert_parallel.preset_model", None),
    ("expert_parallel.use_grouped_mm", True),
    ("expert_parallel.disable_triton_grouped_mm", False),
    ("expert_parallel.moe_layer_pattern", None),
    ("expert_parallel.router_pattern", None),
    ("expert_parallel.expert_pattern", None),
    ("expert_parallel.score_func", "auto"),
    ("expert_parallel.score_apply", "auto"),
    ("expert_parallel.combine_impl", "auto"),
    ("expert_parallel.route_norm", None),
    ("expert_parallel.route_scale", 1.0),
    ("expert_parallel.top_k", "auto"),
    ("expert_parallel.routed_scaling_factor", "auto"),
    ("expert_parallel.num_expert_groups", None),
    ("expert_parallel.num_limited_groups", None),
    ("expert_parallel.load_balance_coeff", None),
    ("expert_parallel.expert_w1", None),
    ("expert_parallel.expert_w2", None),
    ("expert_parallel.num_experts_attr", None),
    ("expert_parallel.top_k_attr", None),
    ("expert_parallel.has_shared_experts", None),
    ("expert_parallel.shared_experts_pattern", None),
    ("sequence_parallel_size", 1),
    ("seq_parallel_communication_data_type", "fp32"),
    ("disable_python_gc", False),
    ("steps_per_print", 10),
    ("wall_clock_breakdown", False),
    ("dump_state", False),
    ("autotuning.enabled", False),
    ("autotuning.results_dir", "autotuning_results"),
    ("autotuning.exps_dir", "autotuning_exps"),
    ("autotuning.overwrite", False),
    ("autotuning.metric", "throughput"),
    ("autotuning.start_profile_step", 3),
    ("autotuning.end_profile_step", 5),
    ("autotuning.fast", True),
    ("autotuning.max_train_batch_size", None),
    ("autotuning.mp_size", 1),
    ("autotuning.num_tuning_micro_batch_sizes", 3),
    ("autotuning.tuner_type", "model_based"),
    ("autotuning.tuner_early_stopping", 5),
    ("autotuning.tuner_num_trials", 50),
    ("autotuning.arg_mappings", None),
    ("flops_profiler.enabled", False),
    ("flops_profiler.profile_step", 1),
    ("flops_profiler.module_depth", -1),
    ("flops_profiler.top_modules", 1),
    ("flops_profiler.detailed", True),
    ("flops_profiler.output_file", None),
    ("activation_checkpointing.partition_activations", False),
    ("activation_checkpointing.cpu_checkpointing", False),
    ("activation_checkpointing.contiguous_memory_optimization", False),
    ("activation_checkpointing.number_checkpoints", None),
    ("activation_checkpointing.synchronize_checkpoint_boundary", False),
    ("activation_checkpointing.profile", False),
    ("data_efficiency.enabled", False),
    ("data_efficiency.seed", 1234),
    ("data_efficiency.data_routing.enabled", False),
    ("data_efficiency.data_routing.random_ltd.enabled", False),
    ("data_efficiency.data_sampling.enabled", False),
    ("data_efficiency.data_sampling.num_epochs", 1000),
    ("data_efficiency.data_sampling.num_workers", 0),
    ("data_efficiency.data_sampling.curriculum_learning.enabled", False),
    ("tensorboard.enabled", False),
    ("tensorboard.output_path", None),
    ("tensorboard.job_name", "DeepSpeedJobName"),
    ("wandb.enabled", False),
    ("wandb.group", None),
    ("wandb.team", None),
    ("wandb.project", "deepspeed"),
    ("comet.enabled", False),
    ("comet.workspace", None),
    ("comet.project", None),
    ("comet.samples_log_interval", 100),
    ("comet.experiment_name", None),
    ("comet.api_key", None),
    ("comet.experiment_key", None),
    ("comet.online", None),
    ("comet.mode", None),
    ("csv_monitor.enabled", False),
    ("csv_monitor.output_path", None),
    ("csv_monitor.job_name", "DeepSpeedJobName"),
    ("comms_logger.enabled", False),
    ("comms_logger.verbose", False),
    ("comms_logger.prof_all", True),
    ("comms_logger.debug", False),
    ("comms_logger.prof_ops", []),
    ("checkpoint.tag_validation", "Warn"),
    ("checkpoint.load_universal", False),
    ("checkpoint.use_node_local_storage", False),
    ("checkpoint.parallel_write.pipeline_stage", False),
    ("compile.passes", []),
    ("compile.offload_activation", False),
    ("compile.offload_activation_pin_memory", True),
    ("data_types.grad_accum_dtype", None),
]

_CONFIG = {"train_micro_batch_size_per_gpu": 2,
           "zero_optimization": {"offload_param": {}, "offload_optimizer": {}, "stage": 3}}


def _get(cfg, dotted):
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


@pytest.fixture(scope="module")
def loaded():
    return dsconfig.load(_CONFIG)


@pytest.mark.parametrize(("path", "default"), REFERENCE_DEFAULTS, ids=[p for p, _ in REFERENCE_DEFAULTS])
def test_reference_default(loaded, path, default):
    if path == "zero_optimization.stage":
        assert dsconfig.load({}).zero_optimization.stage == default
        return
    value = _get(loaded, path)
    assert (value == default and type(value) is type(default)) or (isinstance(default, int) and value == default)


def test_micro_batch_alone_gives_the_train_batch_size_at_the_world_size():
    """'train_micro_batch_size_per_gpu: default train_batch_size value' (with accumulation 1)."""
    cfg = dsconfig.load({"train_micro_batch_size_per_gpu": 4}, world_size=2)
    assert (cfg.train_batch_size, cfg.gradient_accumulation_steps) == (8, 1)


def test_optional_sections_default_to_absent():
    cfg = dsconfig.load({})
    assert cfg.optimizer is None and cfg.scheduler is None
    assert cfg.zero_optimization.offload_param is None and cfg.zero_optimization.offload_optimizer is None


def test_defaults_command_output_round_trips():
    cfg = dsconfig.DeepSpeedConfig()
    assert dsconfig.load(cfg.to_dict()) == cfg
