"""No silent keys: every leaf of the config schema (dsconfig.json_schema(), which covers the reference's
keys and the old spellings and DeepSpeed-only keys dsconfig knows) is in KEYS below, and does what its
entry says when the smallest config that turns it on is given:

- observed: a named test sees the behaviour the key changes (the test must exist and its file must
  mention the key);
- refused: initialize() raises, naming the key (or, for a key of a feature refused as a whole, the key
  that turns that feature on);
- warned: dsconfig.load warns, naming the key.

A key added to the schema without an entry here fails test_the_table_covers_every_key; an entry whose
refusal or warning stops happening fails the checks below. Reclassify a key when its behaviour changes
(for instance, once a library provides AutoEP, expert_parallel.* become observed by its tests).
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dsconfig
import dstrain
import dszero
from dscomm.testing import run_ranks
from dsconfig.keys import _NOT_FEATURE_REQUESTS, KNOWN_KEYS

ROOT = Path(__file__).resolve().parents[2]
HERE = "facade/tests/test_every_config_key.py"
HYBRID = "facade/tests/test_hybrid_engine.py"

# Honoured by handing it to a third-party service, which only an online run uses: no offline test can see
# it. Kept to this one key on purpose (comet_ml.start(api_key=...); COMET_API_KEY otherwise).
EXTERNAL = {"comet.api_key"}


def obs(test: str, mentions: str | None = None) -> tuple:
    """`mentions`: the name the test's file uses for the key, where a library takes it as a flat argument."""
    return ("observed", test, mentions)


def warned(cfg: dict) -> tuple:
    return ("warned", cfg)


def refused(cfg: dict, named: str | None = None) -> tuple:
    return ("refused", cfg, named)


def _zero(**keys) -> dict:
    return {"zero_optimization": keys}


def _nvme(**keys) -> dict:
    return _zero(stage=3, offload_optimizer={"device": "nvme", "nvme_path": "/tmp", **keys})


def _autoep(key: str, value) -> tuple:
    return refused({"expert_parallel": {"enabled": True, key: value}}, "expert_parallel.enabled")


DSCONFIG = "libs/dsconfig/tests"
DSZERO = "libs/dszero/tests"
FACADE = "facade/tests"
DSDATA = "libs/dsdata/tests"
DSMON = "libs/dsmonitor/tests"
AUTOEP = "libs/dsmoe/tests/test_autoep.py"
SCHEDULES = f"{DSDATA}/test_schedules.py::test_deepspeed_golden_fixed_linear"
SAMPLER = f"{FACADE}/test_data_efficiency.py::test_sampler_loader_on_two_ranks_resumes_exactly_through_checkpoints"
LTD = f"{DSDATA}/test_random_ltd.py::test_reserved_length_never_below_min_value_and_layer_tokens"
LEGACY = f"{FACADE}/test_curriculum_legacy.py::test_forward_gets_the_schedule_through_accumulation_and_resume"
AUTOTUNE_SPACE = f"{FACADE}/test_autotuning_space.py"
AUTOTUNE_SEARCH = f"{FACADE}/test_autotuning_search.py"
DSCOMPILE = "libs/dscompile/tests/test_compiled_zero.py"
DSCOMPILE_PACKAGE = "libs/dscompile/tests/test_package.py"
AUTOTUNE_E2E = f"{FACADE}/test_autotuning_e2e.py::test_crashing_out_of_memory_and_hanging_experiments_are_recorded_and_skipped"
METRIC = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<name>"
TP_SPEC = "tensor_parallel.partition_config.layer_specs[]"

KEYS: dict[str, tuple] = {
    # ---- batch, optimizer, scheduler, communication
    "train_batch_size": obs(f"{FACADE}/test_initialize.py::test_batch_triple_is_completed_from_the_world_size"),
    "train_micro_batch_size_per_gpu": obs(f"{FACADE}/test_initialize.py::test_batch_triple_is_completed_from_the_world_size"),
    "gradient_accumulation_steps": obs(f"{FACADE}/test_initialize.py::test_batch_triple_is_completed_from_the_world_size"),
    "managed_gradient_accumulation": obs(f"{FACADE}/test_engine_vs_ddp.py::test_unmanaged_accumulation_steps_when_the_caller_says"),
    "optimizer.type": obs(f"{FACADE}/test_optimizers.py::test_build_optimizer_picks_the_class"),
    "optimizer.params": obs(f"{FACADE}/test_optimizers.py::test_adam_from_config_steps_like_torch"),
    "scheduler.type": obs(f"{FACADE}/test_optimizers.py::test_build_scheduler_deepspeed_and_torch_and_errors"),
    "scheduler.params": obs(f"{FACADE}/test_lr_schedules.py::test_warmup_lr_curve"),
    "communication_data_type": obs(f"{DSZERO}/test_gradient_dtypes.py::test_communication_dtype_is_the_wire_and_accumulation_keeps_its_own_dtype"),
    "gradient_allreduce_op": obs(f"{FACADE}/test_precision.py::test_gradient_allreduce_op_sum_is_world_times_mean"),
    "prescale_gradients": obs(f"{FACADE}/test_precision.py::test_predivide_and_prescale_give_the_mean"),
    "gradient_predivide_factor": obs(f"{FACADE}/test_precision.py::test_predivide_and_prescale_give_the_mean"),
    "gradient_clipping": obs(f"{FACADE}/test_precision.py::test_gradient_clipping_bounds_the_update_to_the_clip_norm"),
    # ---- precision
    "fp16.enabled": obs(f"{FACADE}/test_precision.py::test_fp16_overflow_skips_the_step_and_halves_the_scale"),
    "fp16.auto_cast": obs(f"{FACADE}/test_precision.py::test_fp16_auto_cast_casts_float_inputs"),
    "fp16.loss_scale": obs(f"{FACADE}/test_precision.py::test_fp16_static_loss_scale_trains"),
    "fp16.initial_scale_power": obs(f"{FACADE}/test_precision.py::test_fp16_overflow_skips_the_step_and_halves_the_scale"),
    "fp16.loss_scale_window": obs(f"{DSZERO}/test_precision.py::test_dynamic_scaler_follows_the_reference"),
    "fp16.hysteresis": obs(f"{FACADE}/test_precision.py::test_fp16_overflow_skips_the_step_and_halves_the_scale"),
    "fp16.consecutive_hysteresis": obs(f"{HERE}::test_consecutive_hysteresis_refills_after_every_clean_step"),
    "fp16.min_loss_scale": obs(f"{DSZERO}/test_precision.py::test_dynamic_scaler_follows_the_reference"),
    "fp16.fp16_master_weights_and_grads": obs(f"{FACADE}/test_offload_optimizer.py::test_low_precision_masters_keep_the_states_the_reference_says_on_the_cpu"),
    "bf16.enabled": obs(f"{FACADE}/test_precision.py::test_bf16_trains_with_bf16_parameters"),
    "bf16.bf16_master_weights_and_grads": obs(f"{FACADE}/test_offload_optimizer.py::test_low_precision_masters_keep_the_states_the_reference_says_on_the_cpu"),
    "bf16.check_grad_overflow": obs("facade/tests/test_deepspeed_paths_round5_r5_precision.py::"
                                    "test_a_bf16_step_with_non_finite_gradients_is_skipped_whatever_check_grad_overflow"),
    "bf16.bf16_optimizer_states": obs(f"{FACADE}/test_offload_optimizer.py::test_low_precision_masters_keep_the_states_the_reference_says_on_the_cpu"),
    "torch_autocast.enabled": obs(f"{FACADE}/test_precision.py::test_torch_autocast_runs_matmuls_in_bf16_and_keeps_fp32_weights"),
    "torch_autocast.dtype": obs(f"{HERE}::test_engine_observations"),
    "torch_autocast.lower_precision_safe_modules": warned({"torch_autocast": {"enabled": True}}),
    "data_types.buffer_dtype": obs("facade/tests/test_precision.py::test_bf16_keeps_fp32_buffers_unless_buffer_dtype_names_one"),
    "data_types.param_dtype": obs("facade/tests/test_precision.py::test_a_param_dtype_the_precision_mode_contradicts_is_refused_by_name"),
    "data_types.grad_accum_dtype": obs(f"{DSZERO}/test_gradient_dtypes.py::test_grad_accum_dtype_fp32_accumulates_a_bf16_model_in_fp32_at_every_stage"),
    # ---- ZeRO
    "zero_optimization.stage": obs(f"{FACADE}/test_engine_vs_ddp.py::test_every_stage_matches_ddp_at_two_ranks"),
    "zero_optimization.allgather_partitions": warned(_zero(allgather_partitions=False)),
    "zero_optimization.allgather_bucket_size": warned(_zero(stage=2, allgather_bucket_size=2e8)),
    "zero_optimization.compute_grad_norm": warned(_zero(compute_grad_norm=False)),
    "zero_optimization.overlap_comm": obs(f"{DSZERO}/test_stages_vs_ddp.py::test_same_losses_and_weights_as_ddp"),
    "zero_optimization.reduce_scatter": warned(_zero(reduce_scatter=False)),
    "zero_optimization.reduce_bucket_size": obs(f"{DSZERO}/test_config_agreement.py::test_dszero_runs_every_zero_config_dsconfig_accepts_with_the_same_numbers"),
    "zero_optimization.contiguous_gradients": warned(_zero(contiguous_gradients=False)),
    "zero_optimization.load_from_fp32_weights": obs(f"{DSZERO}/test_zero_keys.py::test_load_from_fp32_weights_false_starts_the_masters_from_the_16_bit_weights"),
    "zero_optimization.round_robin_gradients": warned(_zero(round_robin_gradients=True)),
    "zero_optimization.parameter_alignment": refused(_zero(stage=2, parameter_alignment=True)),
    "zero_optimization.offload_param.device": obs(f"{DSZERO}/test_offload.py::test_stage3_offload_trains_exactly_like_no_offload"),
    "zero_optimization.offload_param.nvme_path": obs(f"{DSZERO}/test_offload.py::test_swap_files_hold_what_memory_report_says"),
    "zero_optimization.offload_param.pin_memory": obs(f"{DSZERO}/test_offload.py::test_refused_pinning_warns_and_trains"),
    "zero_optimization.offload_param.buffer_count": obs(f"{DSZERO}/test_offload.py::test_stage3_offload_trains_exactly_like_no_offload"),
    "zero_optimization.offload_param.buffer_size": obs(f"{DSZERO}/test_offload.py::test_swap_files_hold_what_memory_report_says"),
    "zero_optimization.offload_param.max_in_cpu": obs(f"{DSZERO}/test_offload.py::test_stage3_offload_trains_exactly_like_no_offload"),
    "zero_optimization.offload_optimizer.device": obs(f"{FACADE}/test_offload_optimizer.py::test_config_adamw_under_cpu_offload_steps_with_cpu_adam"),
    "zero_optimization.offload_optimizer.nvme_path": obs(f"{DSZERO}/test_offload.py::test_nvme_optimizer_offload_at_stage2"),
    "zero_optimization.offload_optimizer.pin_memory": obs(f"{DSZERO}/test_offload.py::test_refused_pinning_warns_and_trains"),
    "zero_optimization.offload_optimizer.ratio": refused(_zero(stage=2, offload_optimizer={"device": "cpu", "ratio": 0.3})),
    "zero_optimization.offload_optimizer.buffer_count": obs(f"{DSZERO}/test_offload.py::test_bad_offload_settings_name_the_key"),
    "zero_optimization.offload_optimizer.fast_init": warned(_nvme(fast_init=True)),
    "zero_optimization.offload_optimizer.pipeline_read": warned(_nvme(pipeline_read=True)),
    "zero_optimization.offload_optimizer.pipeline_write": warned(_nvme(pipeline_write=True)),
    "zero_optimization.stage3_max_live_parameters": obs(f"{DSZERO}/test_reuse.py::test_max_live_parameters_bounds_prefetched_kept_and_on_demand_gathers"),
    "zero_optimization.stage3_max_reuse_distance": obs(f"{DSZERO}/test_reuse.py::test_reused_units_are_gathered_once_per_step_with_the_same_losses"),
    "zero_optimization.stage3_prefetch_bucket_size": obs(f"{DSZERO}/test_prefetch.py::test_the_bucket_bounds_the_elements_chosen_and_not_yet_needed"),
    "zero_optimization.stage3_param_persistence_threshold": obs(f"{DSZERO}/test_stage3.py::test_small_units_stay_gathered_under_the_persistence_threshold"),
    "zero_optimization.sub_group_size": obs(f"{DSZERO}/test_offload.py::test_swap_files_hold_what_memory_report_says"),
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": obs(f"{FACADE}/test_checkpoint_options.py::test_save_16bit_model"),
    "zero_optimization.stage3_module_granularity_threshold": warned(_zero(stage=3, stage3_module_granularity_threshold=100)),
    "zero_optimization.ignore_unused_parameters": obs(f"{DSZERO}/test_zero_keys.py::test_ignore_unused_parameters_false_refuses_a_step_with_parameters_without_gradients"),
    "zero_optimization.zero_hpz_partition_size": obs(f"{DSZERO}/test_zeropp.py::test_hpz_moves_the_backward_gather_inside_the_node"),
    "zero_optimization.zero_quantized_weights": obs(f"{DSZERO}/test_zeropp.py::test_qwz_halves_the_weight_bytes_from_fp16"),
    "zero_optimization.zero_quantized_gradients": obs(f"{DSZERO}/test_zeropp.py::test_qgz_cuts_gradient_bytes_fourfold_per_step_and_more_across_nodes"),
    "zero_optimization.log_trace_cache_warnings": obs(f"{DSZERO}/test_zero_keys.py::test_log_trace_cache_warnings_logs_when_the_module_order_leaves_the_recording"),
    "zero_optimization.save_muon_momentum_buffer_in_memory": obs(f"{DSZERO}/test_whole_tensors.py::test_momentum_stays_in_memory_under_nvme_offload"),
    "zero_optimization.leaf_module.classes": obs(f"{DSZERO}/test_leaf_modules.py::test_zero_optimization_leaf_module_marks_the_config_s_modules"),
    "zero_optimization.leaf_module.names": obs(f"{DSZERO}/test_leaf_modules.py::test_zero_optimization_leaf_module_marks_the_config_s_modules"),
    "zero_optimization.leaf_module.name_suffixes": obs(f"{DSZERO}/test_leaf_modules.py::test_zero_optimization_leaf_module_marks_the_config_s_modules"),
    # ---- asynchronous I/O (dsaio's handle, built from the section for NVMe offload)
    "aio.block_size": obs("libs/dsaio/tests/test_async.py::test_handle_defaults_and_getters"),
    "aio.queue_depth": obs("libs/dsaio/tests/test_async.py::test_handle_defaults_and_getters"),
    "aio.thread_count": obs(f"{DSCONFIG}/test_keys_and_sources.py::test_thread_count_and_intra_op_parallelism_are_one_setting"),
    "aio.single_submit": obs("libs/dsaio/tests/test_roundtrip.py::test_submit_and_overlap_modes"),
    "aio.overlap_events": obs("libs/dsaio/tests/test_roundtrip.py::test_submit_and_overlap_modes"),
    "aio.use_gds": refused({"aio": {"use_gds": True}}),
    # ---- tensor parallelism (dstp)
    "tensor_parallel.autotp_size": obs(f"{FACADE}/test_tp_engine.py::test_tp2_x_dp2_with_zero_equals_one_process"),
    # ---- sequence parallelism (dsseq)
    "sequence_parallel_size": obs(f"{FACADE}/test_sequence_parallel.py::test_sp2_by_dp2_trains_as_one_rank_on_the_whole_sequence"),
    "seq_parallel_communication_data_type": obs(f"{FACADE}/test_sequence_parallel.py::test_gradients_go_over_the_wire_in_the_sequence_parallel_dtype"),
    "tensor_parallel.preset_model": obs("libs/dstp/tests/test_plan.py::test_the_llama_preset_splits_attention_and_mlp_and_reports_what_no_rule_matched"),
    "tensor_parallel.tp_overlap_comm": obs("libs/dstp/tests/test_equivalence.py::test_overlap_on_equals_off_and_vocab_parallel_loss_equals_the_gathered_loss"),
    "tensor_parallel.vocab_parallel_lm_head": obs("libs/dstp/tests/test_plan.py::test_vocab_parallel_head_splits_an_untied_head_and_keeps_a_tied_one_whole"),
    "tensor_parallel.partition_config.use_default_specs": obs("libs/dstp/tests/test_plan.py::test_partition_config_precedes_the_models_plan_and_merges_with_a_preset"),
    f"{TP_SPEC}.patterns": obs("libs/dstp/tests/test_plan.py::test_partition_config_precedes_the_models_plan_and_merges_with_a_preset"),
    f"{TP_SPEC}.partition_type": obs("libs/dstp/tests/test_plan.py::test_partition_config_precedes_the_models_plan_and_merges_with_a_preset"),
    f"{TP_SPEC}.shape": obs("libs/dstp/tests/test_plan.py::test_fused_weights_split_each_sub_parameter_so_ranks_keep_whole_heads"),
    f"{TP_SPEC}.partition_dim": obs("libs/dstp/tests/test_plan.py::test_fused_weights_split_each_sub_parameter_so_ranks_keep_whole_heads"),
    f"{TP_SPEC}.model_types": obs("libs/dstp/tests/test_plan.py::test_model_types_limit_a_rule"),
    # ---- the hybrid engine (facade/src/dstrain/engine/hybrid/)
    "hybrid_engine.enabled": obs(f"{HYBRID}::test_generation_yields_the_whole_models_tokens_at_every_stage_and_variant"),
    "hybrid_engine.max_out_tokens": obs(f"{HYBRID}::test_each_refusal_names_its_key"),
    "hybrid_engine.inference_tp_size": obs(f"{HYBRID}::test_tensor_parallel_generation_yields_the_whole_models_tokens"),
    "hybrid_engine.release_inference_cache": obs(
        f"{HYBRID}::test_generation_yields_the_whole_models_tokens_at_every_stage_and_variant"),
    "hybrid_engine.pin_parameters": obs(
        f"{HYBRID}::test_generation_yields_the_whole_models_tokens_at_every_stage_and_variant"),
    "hybrid_engine.tp_gather_partition_size": obs(
        f"{HYBRID}::test_tensor_parallel_generation_yields_the_whole_models_tokens"),
    "hybrid_engine.enable_cuda_graph": obs(f"{HYBRID}::test_each_refusal_names_its_key"),
    # ---- AutoEP (dsmoe.autoep)
    "expert_parallel.enabled": obs(f"{FACADE}/test_autoep_engine.py::test_autoep_engine_equals_one_process_at_every_size_and_stage"),
    "expert_parallel.autoep_size": obs(f"{FACADE}/test_autoep_engine.py::test_autoep_engine_equals_one_process_at_every_size_and_stage"),
    "expert_parallel.expert_tensor_parallel_size": obs(f"{AUTOEP}::test_constraints_are_refused_naming_the_key"),
    "expert_parallel.async_split_plan": obs(f"{AUTOEP}::test_constraints_are_refused_naming_the_key"),
    "expert_parallel.preset_model": obs(f"{AUTOEP}::test_preset_choice"),
    "expert_parallel.use_grouped_mm": obs(f"{AUTOEP}::test_backend_choice_follows_the_config"),
    "expert_parallel.disable_triton_grouped_mm": obs(f"{AUTOEP}::test_backend_choice_follows_the_config"),
    "expert_parallel.moe_layer_pattern": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.router_pattern": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.expert_pattern": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.score_func": obs(f"{AUTOEP}::test_routing_settings_are_read_from_each_model"),
    "expert_parallel.score_apply": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.combine_impl": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.route_norm": obs(f"{AUTOEP}::test_routing_settings_are_read_from_each_model"),
    "expert_parallel.route_scale": obs(f"{AUTOEP}::test_routing_settings_are_read_from_each_model"),
    "expert_parallel.top_k": obs(f"{AUTOEP}::test_routing_settings_are_read_from_each_model"),
    "expert_parallel.routed_scaling_factor": obs(f"{AUTOEP}::test_routing_settings_are_read_from_each_model"),
    "expert_parallel.num_expert_groups": obs(f"{AUTOEP}::test_routing_settings_are_read_from_each_model"),
    "expert_parallel.num_limited_groups": obs(f"{AUTOEP}::test_constraints_are_refused_naming_the_key"),
    "expert_parallel.load_balance_coeff": obs(f"{AUTOEP}::test_constraints_are_refused_naming_the_key"),
    "expert_parallel.expert_w1": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.expert_w2": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.expert_w3": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.num_experts_attr": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.top_k_attr": obs(f"{AUTOEP}::test_custom_model_through_the_patterns"),
    "expert_parallel.has_shared_experts": obs(f"{AUTOEP}::test_routing_settings_are_read_from_each_model"),
    "expert_parallel.shared_experts_pattern": obs(f"{AUTOEP}::test_routing_settings_are_read_from_each_model"),
    "expert_parallel.shared_experts_gate_pattern": obs(f"{AUTOEP}::test_routing_settings_are_read_from_each_model"),
    # ---- pipeline parallelism (dspipe)
    "pipeline.stages": obs(f"{FACADE}/test_pipe_engine.py::test_zero_1_and_2_beside_the_pipeline_equal_plain_data_parallelism"),
    "pipeline.partition": obs(f"{FACADE}/test_pipe_engine.py::test_what_a_pipeline_cannot_do_is_refused_by_key_and_a_batch_can_be_traced"),
    "pipeline.seed_layers": obs(f"{FACADE}/test_pipe_engine.py::test_what_a_pipeline_cannot_do_is_refused_by_key_and_a_batch_can_be_traced"),
    "pipeline.activation_checkpoint_interval": obs("libs/dspipe/tests/test_train_equivalence.py::test_variable_sequence_lengths_with_dynamic_shape_and_activation_checkpointing"),
    "pipeline.pipe_partitioned": warned({"pipeline": {"stages": 2}, "tensor_parallel": {"autotp_size": 2}}),
    "pipeline.grad_partitioned": warned({"pipeline": {"stages": 2}, "tensor_parallel": {"autotp_size": 2}}),
    "pipeline.use_reentrant": warned({"pipeline": {"use_reentrant": False}}),
    "pipeline.schedule": obs(f"{DSCONFIG}/test_pipeline_section.py::test_the_schedule_defaults_to_1f1b_and_takes_every_training_schedule"),
    # ---- the engine's own switches
    "disable_python_gc": obs(f"{FACADE}/test_python_gc_and_second_engine.py::test_disable_python_gc_collects_once_and_holds_the_collector_until_the_last_engine"),
    "steps_per_print": obs(f"{FACADE}/test_monitoring.py::test_flops_profile_comms_log_and_gc_switch"),
    "wall_clock_breakdown": obs(f"{FACADE}/test_monitoring.py::test_csv_and_tensorboard_hold_the_loss_lr_and_timers_by_sample"),
    "log_level": obs(f"{FACADE}/test_deepspeed_paths_round4.py::test_round4_paths_resolve_under_the_alias_and_work"),
    "dump_state": obs(f"{FACADE}/test_monitoring.py::test_flops_profile_comms_log_and_gc_switch"),
    "dataloader_drop_last": obs(f"{HERE}::test_engine_observations"),
    "rank_watchdog.enabled": obs(f"{FACADE}/test_rank_watchdog.py::test_the_watchdog_is_on_by_default_with_its_timeout"),
    "rank_watchdog.timeout": obs(f"{FACADE}/test_rank_watchdog.py::test_a_stopped_rank_is_named_and_the_job_ends"),
    # ---- autotuning (dstrain --autotuning)
    "autotuning.enabled": obs(f"{FACADE}/test_autotuning_e2e.py::test_autotuning_enabled_in_a_config_trains_as_configured"),
    "autotuning.results_dir": obs(AUTOTUNE_E2E),
    "autotuning.exps_dir": obs(AUTOTUNE_E2E),
    "autotuning.overwrite": obs(AUTOTUNE_E2E),
    "autotuning.metric": obs(f"{AUTOTUNE_SEARCH}::test_model_based_minimises_latency"),
    "autotuning.start_profile_step": obs(f"{FACADE}/test_autotuning_e2e.py::test_example_gpt_is_tuned_at_two_ranks_then_trained_with_the_chosen_config"),
    "autotuning.end_profile_step": obs(f"{FACADE}/test_autotuning_e2e.py::test_example_gpt_is_tuned_at_two_ranks_then_trained_with_the_chosen_config"),
    "autotuning.fast": obs(f"{AUTOTUNE_SPACE}::test_fast_tunes_only_stages_and_micro_batches"),
    "autotuning.max_train_batch_size": obs(f"{AUTOTUNE_SEARCH}::test_every_experiment_respects_max_train_batch_size"),
    "autotuning.mp_size": obs(f"{AUTOTUNE_SPACE}::test_the_request_refuses_what_it_cannot_tune_by_key"),
    "autotuning.num_tuning_micro_batch_sizes": obs(f"{AUTOTUNE_SPACE}::test_tuning_micro_batches_spread_from_half_the_largest",
                                                   mentions="tuning_micro_batches"),
    "autotuning.tuner_type": obs(f"{AUTOTUNE_SEARCH}::test_gridsearch_goes_in_grid_order_and_random_shuffles_reproducibly"),
    "autotuning.tuner_early_stopping": obs(f"{AUTOTUNE_SEARCH}::test_early_stopping_stops_that_many_trials_after_the_best",
                                           mentions="early_stopping"),
    "autotuning.tuner_num_trials": obs(f"{AUTOTUNE_SEARCH}::test_the_tuner_and_its_limits_apply_within_each_stage"),
    "autotuning.arg_mappings": obs(f"{AUTOTUNE_SPACE}::test_arg_mappings_set_the_scripts_flags"),
    # ---- flops profiler (dsmonitor, reported by the engine)
    "flops_profiler.enabled": obs(f"{FACADE}/test_monitoring.py::test_flops_profile_comms_log_and_gc_switch"),
    "flops_profiler.profile_step": obs(f"{FACADE}/test_monitoring.py::test_flops_profile_comms_log_and_gc_switch"),
    "flops_profiler.module_depth": obs(f"{DSMON}/test_profiler.py::test_print_model_profile_depth_and_top_modules"),
    "flops_profiler.top_modules": obs(f"{DSMON}/test_profiler.py::test_print_model_profile_depth_and_top_modules"),
    "flops_profiler.detailed": obs(f"{DSMON}/test_profiler.py::test_print_model_profile_depth_and_top_modules"),
    "flops_profiler.output_file": obs(f"{DSMON}/test_profiler.py::test_print_model_profile_depth_and_top_modules"),
    # ---- activation checkpointing (dscomm.checkpointing, applied by each initialize())
    "activation_checkpointing.partition_activations": obs("libs/dscomm/tests/test_checkpointing.py::test_partition_activations_over_two_model_parallel_ranks"),
    "activation_checkpointing.cpu_checkpointing": obs("libs/dscomm/tests/test_checkpointing.py::test_gradients_equal_no_checkpointing"),
    "activation_checkpointing.contiguous_memory_optimization": obs("libs/dscomm/tests/test_checkpointing.py::test_contiguous_memory_optimization_keeps_partitions_in_number_checkpoints_rows"),
    "activation_checkpointing.number_checkpoints": obs("libs/dscomm/tests/test_checkpointing.py::test_contiguous_memory_optimization_keeps_partitions_in_number_checkpoints_rows"),
    "activation_checkpointing.synchronize_checkpoint_boundary": obs(f"{FACADE}/test_checkpointing.py::test_one_state_behind_both_names_and_the_engine_configures_it"),
    "activation_checkpointing.profile": obs("libs/dscomm/tests/test_checkpointing.py::test_profile_times_forward_and_recompute"),
    # ---- data efficiency (dsdata)
    "data_efficiency.enabled": obs(f"{FACADE}/test_data_efficiency.py::test_curriculum_runs_from_its_own_key_and_says_so"),
    "data_efficiency.seed": obs(SAMPLER),
    "data_efficiency.data_routing.enabled": obs(f"{FACADE}/test_random_ltd_engine.py::test_reserved_length_steps_with_training_and_is_checkpointed"),
    "data_efficiency.data_routing.random_ltd.enabled": obs(f"{FACADE}/test_random_ltd_engine.py::test_reserved_length_steps_with_training_and_is_checkpointed"),
    **{f"data_efficiency.data_routing.random_ltd.{key}": obs(LTD) for key in (
        "total_layer_num", "random_ltd_layer_num", "random_ltd_layer_id", "model_mask_name", "model_type",
        "hidden_state_order", "random_ltd_schedule.min_value", "random_ltd_schedule.max_value",
        "random_ltd_schedule.schedule_type", "random_ltd_schedule.schedule_config.require_steps",
        "random_ltd_schedule.schedule_config.seq_per_step")},
    "data_efficiency.data_sampling.enabled": obs(f"{FACADE}/test_data_efficiency.py::test_curriculum_runs_from_its_own_key_and_says_so"),
    "data_efficiency.data_sampling.num_epochs": obs(SAMPLER),
    "data_efficiency.data_sampling.num_workers": obs(f"{DSDATA}/test_data_sampler.py::test_a_resumed_loader_draws_exactly_the_batches_of_an_uninterrupted_one"),
    "data_efficiency.data_sampling.curriculum_learning.enabled": obs(f"{FACADE}/test_data_efficiency.py::test_curriculum_runs_from_its_own_key_and_says_so"),
    "data_efficiency.data_sampling.curriculum_learning.data_cluster_path": obs(SAMPLER),
    f"{METRIC}.index_to_sample_path": obs(SAMPLER),
    f"{METRIC}.index_to_metric_path": obs(SAMPLER),
    f"{METRIC}.difficulty_type": obs(f"{DSDATA}/test_data_sampler.py::test_percentile_difficulty_admits_the_easiest_share"),
    f"{METRIC}.clustering_type": obs(f"{DSDATA}/test_schedules.py::test_state_round_trip_and_dsconfig_sections"),
    f"{METRIC}.min_difficulty": obs(SCHEDULES),
    f"{METRIC}.max_difficulty": obs(SCHEDULES),
    f"{METRIC}.schedule_type": obs(f"{DSDATA}/test_data_sampler.py::test_custom_schedule_and_the_end_of_the_run"),
    f"{METRIC}.schedule_config.total_curriculum_step": obs(SCHEDULES),
    f"{METRIC}.schedule_config.difficulty_step": obs(SCHEDULES),
    f"{METRIC}.schedule_config.root_degree": obs(f"{DSDATA}/test_schedules.py::test_fixed_root_by_hand"),
    f"{METRIC}.schedule_config.difficulty": obs(f"{DSDATA}/test_schedules.py::test_deepspeed_golden_fixed_discrete"),
    f"{METRIC}.schedule_config.max_step": obs(f"{DSDATA}/test_schedules.py::test_deepspeed_golden_fixed_discrete"),
    "curriculum_learning.enabled": obs(f"{FACADE}/test_curriculum_legacy.py::test_a_legacy_seqlen_config_from_the_corpus_trains"),
    "curriculum_learning.curriculum_type": obs(f"{FACADE}/test_curriculum_legacy.py::test_a_model_without_curriculum_seqlen_is_refused_by_key"),
    **{f"curriculum_learning.{key}": obs(LEGACY) for key in (
        "min_difficulty", "max_difficulty", "schedule_type", "schedule_config.total_curriculum_step",
        "schedule_config.difficulty_step")},
    "curriculum_learning.schedule_config.root_degree": obs(f"{DSDATA}/test_schedules.py::test_fixed_root_by_hand"),
    "curriculum_learning.schedule_config.difficulty": obs(f"{DSDATA}/test_schedules.py::test_deepspeed_golden_fixed_discrete"),
    "curriculum_learning.schedule_config.max_step": obs(f"{DSDATA}/test_schedules.py::test_deepspeed_golden_fixed_discrete"),
    # ---- monitors (dsmonitor)
    "tensorboard.enabled": obs(f"{FACADE}/test_monitoring.py::test_csv_and_tensorboard_hold_the_loss_lr_and_timers_by_sample"),
    "tensorboard.output_path": obs(f"{DSMON}/test_backends.py::test_tensorboard_holds_every_scalar_at_its_step"),
    "tensorboard.job_name": obs(f"{DSMON}/test_backends.py::test_tensorboard_holds_every_scalar_at_its_step"),
    "wandb.enabled": obs(f"{DSMON}/test_master.py::test_all_four_backends_from_a_deepspeed_config"),
    "wandb.group": obs(f"{DSMON}/test_backends.py::test_wandb_offline_run_holds_the_history"),
    "wandb.team": obs(f"{DSMON}/test_backends.py::test_wandb_offline_run_holds_the_history"),
    "wandb.project": obs(f"{DSMON}/test_backends.py::test_wandb_offline_run_holds_the_history"),
    "comet.enabled": obs(f"{DSMON}/test_master.py::test_all_four_backends_from_a_deepspeed_config"),
    "comet.workspace": obs(f"{DSMON}/test_backends.py::test_comet_offline_archive_holds_the_metrics"),
    "comet.project": obs(f"{DSMON}/test_backends.py::test_comet_offline_archive_holds_the_metrics"),
    "comet.samples_log_interval": obs(f"{DSMON}/test_backends.py::test_comet_logs_each_name_once_per_samples_log_interval"),
    "comet.experiment_name": obs(f"{DSMON}/test_backends.py::test_comet_offline_archive_holds_the_metrics"),
    "comet.api_key": ("external", "passed to comet_ml.start; only an online run uses it"),
    "comet.experiment_key": obs(f"{HERE}::test_comet_experiment_key_names_the_offline_experiment"),
    "comet.online": obs(f"{DSMON}/test_backends.py::test_comet_offline_archive_holds_the_metrics"),
    "comet.mode": obs(f"{DSMON}/test_backends.py::test_comet_config_errors_say_what_is_valid"),
    "csv_monitor.enabled": obs(f"{FACADE}/test_monitoring.py::test_csv_and_tensorboard_hold_the_loss_lr_and_timers_by_sample"),
    "csv_monitor.output_path": obs(f"{DSMON}/test_backends.py::test_csv_files_hold_exactly_the_events"),
    "csv_monitor.job_name": obs(f"{DSMON}/test_backends.py::test_csv_files_hold_exactly_the_events"),
    "comms_logger.enabled": obs(f"{FACADE}/test_monitoring.py::test_flops_profile_comms_log_and_gc_switch"),
    "comms_logger.verbose": obs("libs/dscomm/tests/test_logger.py::test_prof_ops_verbose_and_debug"),
    "comms_logger.prof_all": obs("libs/dscomm/tests/test_logger.py::test_configure_from_a_whole_config"),
    "comms_logger.debug": obs("libs/dscomm/tests/test_logger.py::test_prof_ops_verbose_and_debug"),
    "comms_logger.prof_ops": obs("libs/dscomm/tests/test_logger.py::test_prof_ops_verbose_and_debug"),
    # ---- checkpoints
    # ---- elasticity: the batch triple at each data-parallel size (dsconfig.elasticity; the launcher restarts)
    **{f"elasticity.{key}": obs(f"{FACADE}/test_elasticity.py::test_a_job_restarted_at_another_size_keeps_its_batch_and_continues")
       for key in ("enabled", "max_train_batch_size", "micro_batch_sizes", "min_gpus", "max_gpus", "version")},
    "elasticity.ignore_non_elastic_batch_info": obs(
        f"{FACADE}/test_elasticity.py::test_ignored_batch_keys_are_replaced_and_a_loaded_config_picks_again_at_another_size"),
    "elasticity.prefer_larger_batch": obs(f"{DSCONFIG}/test_elasticity.py::test_prefer_larger_batch_breaks_a_tie_between_batches"),
    "elasticity.model_parallel_size": obs(f"{DSCONFIG}/test_elasticity.py::test_node_level_batch_counts_replicas_of_model_parallel_width"),
    "elasticity.num_gpus_per_node": obs(f"{DSCONFIG}/test_elasticity.py::test_node_level_batch_counts_replicas_of_model_parallel_width"),
    # the scheduler's (minutes a job runs before it is rescaled); checked and carried, as DeepSpeed only carries it
    "elasticity.min_time": obs(f"{DSCONFIG}/test_elasticity.py::test_bad_values_are_named"),
    "checkpoint.tag_validation": obs(f"{FACADE}/test_checkpoint_options.py::test_tag_validation_fail_and_warn"),
    "checkpoint.load_universal": obs(f"{FACADE}/test_universal_checkpoint.py::test_deepspeeds_universal_folder_loads_at_another_layout"),
    "checkpoint.use_node_local_storage": obs(f"{FACADE}/test_checkpoint_options.py::test_node_local_storage_needs_no_shared_file_system"),
    "checkpoint.parallel_write.pipeline_stage": warned({"checkpoint": {"parallel_write": {"pipeline_stage": True}}}),
    # ---- compiler options: DeepCompile (dscompile); each setting is inert without compile.deepcompile
    "compile.deepcompile": obs(f"{FACADE}/test_deepcompile_engine.py::test_compiled_zero3_engine_trains_as_the_eager_one"),
    "compile.passes": obs(f"{FACADE}/test_compile_passes.py::test_autosp_sp2_by_dp2_trains_as_one_rank_and_autotp_as_eager_autotp_and_refuse_by_key"),
    "compile.free_activation": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    "compile.free_activation_threshold": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    "compile.offload_activation": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    # pins host buffers only where there is a device to copy from (CUDA): no CPU run can see it
    "compile.offload_activation_pin_memory": warned({"compile": {"offload_activation_pin_memory": False}}),
    "compile.offload_opt_states": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    "compile.offload_parameters": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    "compile.double_buffer": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    "compile.sync_before_reduce": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    "compile.sync_after_reduce": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    "compile.sync_before_allgather": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    "compile.sync_after_allgather": obs(f"{DSCOMPILE}::test_each_pass_on_and_off_trains_as_eager_zero3"),
    "compile.debug_log": obs(f"{DSCOMPILE}::test_inductor_compiles_the_inserted_ops_and_matches_eager"),
    "compile.keep_int_input_tensors": obs(f"{DSCOMPILE_PACKAGE}::test_the_profiling_run_keeps_the_input_values_the_keys_ask_for"),
    "compile.keep_all_input_tensors": obs(f"{DSCOMPILE_PACKAGE}::test_the_profiling_run_keeps_the_input_values_the_keys_ask_for"),
}

# Values that turn on a key dsconfig knows by name only (keys.KNOWN_KEYS), where True would not.
_KNOWN_VALUES = {"fp16.opt_level": "O2", "compile.backend": "inductor", "compile.kwargs": {"mode": "max-autotune"},
                 "sparse_attention": {"mode": "fixed"},
                 "compression_training": {"weight_quantization": {}}, "amp": {"enabled": True},
                 "quantize_training": {"enabled": True}, "eigenvalue": {"enabled": True},
                 "progressive_layer_drop": {"enabled": True}, "dynamic_train": {"enabled": True},
                 "nebula": {"enabled": True}, "weight_quantization": {"post_training_quantization": {}},
                 "zero_optimization.mics_shard_size": 2, "zero_optimization.zenflow": {"topk_ratio": 0.1},
                 "zero_optimization.stage3_model_persistence_threshold": 1000,
                 "zero_optimization.model_persistence_threshold": 1000, "zero_optimization.cpu_offload": True,
                 "zero_optimization.cpu_offload_params": True, "zero_optimization.cpu_offload_use_pin_memory": True,
                 "bfloat16": {"enabled": True}}


def _nest(path: str, value) -> dict:
    parts = path.split(".")
    cfg: dict = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        cfg = {part: cfg}
    return cfg


def _known_key_entry(section: str, key: str) -> tuple:
    """What a key the schema knows only by name does (keys.KNOWN_KEYS), and its smallest config."""
    known = KNOWN_KEYS[(section, key)]
    path = f"{section}.{key}" if section else key
    if section == "zero_optimization" and key == "cpu_offload_params":
        cfg = _zero(stage=3, cpu_offload_params=True)
    else:
        value = _KNOWN_VALUES.get(path, True)
        if known.kind in ("renamed", "alias") and known.new_key is not None and value is True:
            value = _new_key_value(section, known.new_key)
        cfg = _nest(path, value)
    if known.kind == "alias":
        return obs(f"{DSCONFIG}/test_keys_and_sources.py::test_thread_count_and_intra_op_parallelism_are_one_setting")
    if known.kind == "unsupported" and (section, key) not in _NOT_FEATURE_REQUESTS:
        return refused(cfg)
    return warned(cfg)


def _new_key_value(section: str, new_key: str):
    """A value the current spelling accepts (what an old spelling moves there)."""
    return {"bf16": {"enabled": True}}.get(new_key, True if "save" in new_key else 1000)


def schema_leaves() -> list[str]:
    schema = dsconfig.json_schema()
    defs = schema["$defs"]
    leaves: list[str] = []

    def walk(node: dict, path: str) -> None:
        if "$ref" in node:
            node = defs[node["$ref"].split("/")[-1]]
        for option in node.get("anyOf", []):
            if "$ref" in option:
                return walk(option, path)
        if node.get("type") == "object" and "properties" in node:
            for key, child in node["properties"].items():
                walk(child, f"{path}.{key}" if path else key)
            return
        extra = node.get("additionalProperties")
        if node.get("type") == "object" and isinstance(extra, dict) and "$ref" in extra:
            return walk(extra, f"{path}.<name>")
        if node.get("type") == "array" and "$ref" in node.get("items", {}):
            return walk(node["items"], f"{path}[]")
        leaves.append(path)

    walk(schema, "")
    return leaves


def full_table() -> dict[str, tuple]:
    table = dict(KEYS)
    for section, key in KNOWN_KEYS:
        table.setdefault(f"{section}.{key}" if section else key, _known_key_entry(section, key))
    return table


TABLE = full_table()


def test_the_table_covers_every_key():
    leaves = schema_leaves()
    assert len(leaves) > 250
    missing = sorted(set(leaves) - set(TABLE))
    assert not missing, f"keys with no entry (observed by a test, refused or warned): {missing}"
    stale = sorted(set(TABLE) - set(leaves))
    assert not stale, f"entries for keys the schema no longer has: {stale}"
    assert {path for path, entry in TABLE.items() if entry[0] == "external"} == EXTERNAL


def _test_functions(file: Path) -> set[str]:
    return {node.name for node in ast.parse(file.read_text()).body if isinstance(node, ast.FunctionDef)}


def test_every_observed_key_names_a_test_that_exists_and_mentions_it():
    problems = []
    for path, entry in TABLE.items():
        if entry[0] != "observed":
            continue
        file, name = entry[1].split("::")
        source = ROOT / file
        if not source.is_file() or name not in _test_functions(source):
            problems.append(f"{path}: {entry[1]} does not exist")
            continue
        leaf = entry[2] or path.replace("[]", "").split(".")[-1]
        if leaf not in source.read_text():
            problems.append(f"{path}: {file} never mentions {leaf!r}")
    assert not problems, "\n".join(problems)


WARNED = sorted(path for path, entry in TABLE.items() if entry[0] == "warned")


@pytest.mark.parametrize("path", WARNED)
def test_a_warned_key_is_named_in_a_warning(path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dsconfig.load(TABLE[path][1], strict=False)
    messages = " ".join(str(w.message) for w in caught if issubclass(w.category, dsconfig.ConfigWarning))
    assert path in messages, messages or "no warning"


REFUSED = sorted(path for path, entry in TABLE.items() if entry[0] == "refused")


def refusals(rank, world):
    """initialize() on each refused key's smallest config, in one process: the message of what it raised."""
    seen = {}
    for path in REFUSED:
        cfg = {**config(), **TABLE[path][1]}
        cfg["zero_optimization"] = {**config()["zero_optimization"], **TABLE[path][1].get("zero_optimization", {})}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dstrain.initialize(model=make_model(), config={**cfg, "optimizer": ADAMW})
            seen[path] = "initialize() accepted it"
        except Exception as exc:  # what initialize raised, whatever its class: the message must name the key
            seen[path] = f"{type(exc).__name__}: {exc}"
    return seen


def test_a_refused_key_stops_initialize_naming_it():
    seen = run_ranks(refusals, 1, timeout=120)[0]
    wrong = {path: message for path, message in seen.items() if (TABLE[path][2] or path) not in message}
    assert not wrong, wrong
    for path in REFUSED:  # and dsconfig says which keys ask for what is missing before any engine is built
        named = TABLE[path][2] or path
        found = [p.path for p in dsconfig.requested_unsupported(TABLE[path][1])]
        assert named in found or not found, (path, found)


# ---- observations of keys no other test looks at

def test_consecutive_hysteresis_refills_after_every_clean_step():
    def scale_after(consecutive):
        fp16 = dsconfig.FP16Config(enabled=True, initial_scale_power=4, hysteresis=2, loss_scale_window=100,
                                   consecutive_hysteresis=consecutive)
        scaler = dszero.Precision.from_config(fp16).make_scaler()
        for overflow in (True, False, True):  # two overflows, a clean step between them
            scaler.update(overflow)
        return scaler.scale

    assert scale_after(False) == 8.0  # the clean step did not refill: the second overflow halves
    assert scale_after(True) == 16.0  # refilled: the second overflow is absorbed again


def engine_observations(rank, world):
    model = make_model()
    seen = []
    model.head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    engine, *_ = dstrain.initialize(model=model, config=config(
        optimizer=ADAMW, torch_autocast={"enabled": True, "dtype": "float16"}))
    engine(TokenDataset().data[:4])
    lengths = []
    for drop in (False, True):
        loader_engine, *_ = dstrain.initialize(model=make_model(), training_data=TokenDataset(size=10),
                                               config=config(micro=4, optimizer=ADAMW, dataloader_drop_last=drop))
        lengths.append(len(loader_engine.training_dataloader))
    return seen, lengths


def test_engine_observations():
    """torch_autocast.dtype sets the autocast dtype; dataloader_drop_last drops the short last batch."""
    seen, lengths = run_ranks(engine_observations, 1, timeout=120)[0]
    assert seen == [torch.float16]
    assert lengths == [3, 2]  # 10 samples in batches of 4


def test_comet_experiment_key_names_the_offline_experiment(tmp_path, monkeypatch):
    pytest.importorskip("comet_ml")
    from dsmonitor import MonitorMaster

    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    cfg = dsconfig.CometConfig(enabled=True, online=False, experiment_key="k" * 32, samples_log_interval=1)
    with MonitorMaster(comet=cfg) as monitor:
        monitor.write_events([("Train/Samples/train_loss", 1.0, 1)])
    assert [p.name.split("-")[0] for p in tmp_path.glob("*.zip")] == ["k" * 32]
