"""Rules between keys that the reference states, checked on the typed config.

A rule finds either a contradiction (always an error: dstrain never trains on a guess) or a
setting that has no effect where it is written (`inert`): an error under strict=True; under
strict=False a warning, and the setting is removed so that what the config says is what runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import attrs

from .config import DeepSpeedConfig
from .errors import Problem
from .fields import AUTO
from .sections import ZeroConfig


@attrs.frozen
class Finding:
    problem: Problem
    inert: bool = False
    warn_only: bool = False  # DeepSpeed itself ignores it with a warning
    neutralize: Callable[[DeepSpeedConfig], DeepSpeedConfig] | None = None


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")  # DeepSpeed's, by name


def _error(path: str, message: str, value=None) -> Finding:
    return Finding(Problem(path, message, value) if value is not None else Problem(path, message))


def _on(flag) -> bool:
    """True or "auto" (may end up on) count as on for rules that guard against a combination."""
    return flag is True


def _evolve_zero(**changes) -> Callable[[DeepSpeedConfig], DeepSpeedConfig]:
    return lambda cfg: attrs.evolve(cfg, zero_optimization=attrs.evolve(cfg.zero_optimization, **changes))


def precision_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    if _on(cfg.fp16.enabled) and _on(cfg.bf16.enabled):
        yield _error("bf16.enabled", "fp16 and bf16 cannot both be enabled; turn one off")
    wanted = cfg.data_types.param_dtype
    if wanted is not None and cfg.fp16.enabled != "auto" and cfg.bf16.enabled != "auto":
        mode = "fp16" if _on(cfg.fp16.enabled) else "bf16" if _on(cfg.bf16.enabled) else "fp32"
        if wanted != mode:
            yield _error("data_types.param_dtype", f"the enabled precision trains the parameters in {mode}; set "
                         f"{'fp16' if wanted == 'fp16' else 'bf16'}.enabled to match or remove the key"
                         if wanted != "fp32" else f"the enabled precision trains the parameters in {mode}; remove "
                         f"the key or turn {mode} off", wanted)
    zero = cfg.zero_optimization
    offload_optimizer = zero.optimizer_offload_device != "none"
    bf16 = cfg.bf16
    if bf16.bf16_optimizer_states and not bf16.bf16_master_weights_and_grads:
        yield _error("bf16.bf16_optimizer_states", "requires bf16.bf16_master_weights_and_grads: true")
    if bf16.bf16_master_weights_and_grads and bf16.enabled is not False:
        if zero.stage == 0:
            yield _error("bf16.bf16_master_weights_and_grads", "needs ZeRO stage 1, 2 or 3 (zero_optimization.stage is 0)")
        elif not bf16.bf16_optimizer_states and not offload_optimizer:
            yield _error("bf16.bf16_master_weights_and_grads",
                         "with fp32 optimizer states it needs zero_optimization.offload_optimizer (CPU Adam); "
                         "or set bf16.bf16_optimizer_states: true")
    fp16_master = cfg.fp16.fp16_master_weights_and_grads and cfg.fp16.enabled is not False
    if fp16_master and (zero.stage not in (2, 3) or not offload_optimizer):
        yield _error("fp16.fp16_master_weights_and_grads",
                     f"requires ZeRO stage 2 or 3 with offload_optimizer (stage is {zero.stage}, "
                     f"offload_optimizer is {zero.optimizer_offload_device})")


def zero_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    zero = cfg.zero_optimization
    if zero.param_offload_device != "none" and zero.stage != 3:
        yield Finding(Problem("zero_optimization.offload_param",
                              f"parameter offload needs ZeRO stage 3 (stage is {zero.stage}); it is ignored"),
                      inert=True, neutralize=_evolve_zero(offload_param=None))
    # NVMe optimizer offload runs at stages 1 and 2 too (dszero swaps the partitioned state the same way).
    if zero.optimizer_offload_device != "none" and zero.stage == 0:
        yield Finding(Problem("zero_optimization.offload_optimizer",
                              "optimizer offload needs ZeRO stage 1, 2 or 3 (stage is 0); it is ignored"),
                      inert=True, neutralize=_evolve_zero(offload_optimizer=None))
    if cfg.gradient_allreduce_op == "sum" and zero.stage == 3:
        yield _error("gradient_allreduce_op", "\"sum\" is not supported with ZeRO stage 3; use \"mean\"", "sum")
    if not cfg.managed_gradient_accumulation and zero.overlap_comm and zero.stage in (0, 1):
        yield _error("zero_optimization.overlap_comm",
                     f"with managed_gradient_accumulation false, overlap_comm is supported only at stage 2 "
                     f"(stage is {zero.stage})", True)
    if zero.zero_hpz_partition_size > 1 and zero.stage != 3:
        yield Finding(Problem("zero_optimization.zero_hpz_partition_size",
                              f"hpZ partitioning applies only to ZeRO stage 3 (stage is {zero.stage}); it is ignored",
                              zero.zero_hpz_partition_size),
                      inert=True, neutralize=_evolve_zero(zero_hpz_partition_size=1))
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):  # ZeRO++ quantizes stage 3's collectives
        if getattr(zero, key) and zero.stage != 3:
            yield Finding(Problem(f"zero_optimization.{key}",
                                  f"ZeRO++ quantization applies only to ZeRO stage 3 (stage is {zero.stage}); it is "
                                  f"ignored", True),
                          inert=True, neutralize=_evolve_zero(**{key: False}))


def _changed(value, default) -> bool:
    return value != AUTO and value != default


def _no_effect(path: str, why: str, value) -> Finding:
    # What trains is the same either way, so strict loading does not refuse these; it warns by name.
    return Finding(Problem(path, why, value), warn_only=True)


def no_effect_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    """Keys that tune DeepSpeed's implementation where dstrain's has nothing to tune, or act only at other
    stages or offloads: set away from their default, each is named in a warning."""
    zero, default = cfg.zero_optimization, ZeroConfig()
    stage, nvme = zero.stage, zero.optimizer_offload_device == "nvme"
    offload = zero.offload_optimizer
    overlap_refused = stage in (0, 1) and not cfg.managed_gradient_accumulation  # an error in zero_rules
    candidates = (
        ("allgather_partitions", not zero.allgather_partitions, "the updated partitions are always all-gathered"),
        ("allgather_bucket_size", _changed(zero.allgather_bucket_size, default.allgather_bucket_size),
         "stages 1-2 all-gather each parameter group's updated shards in one collective, stage 3 module by module"),
        ("reduce_scatter", not zero.reduce_scatter,
         "gradients reach their owners by the collective that suits the backend (the same sums)"),
        ("contiguous_gradients", not zero.contiguous_gradients, "gradients always live in contiguous flat buffers"),
        ("compute_grad_norm", not zero.compute_grad_norm,
         "the global gradient norm is always computed (get_global_grad_norm() reads it)"),
        ("round_robin_gradients", zero.round_robin_gradients,
         "gradient copies to the CPU are not scheduled round-robin over ranks"),
        ("stage3_module_granularity_threshold", zero.stage3_module_granularity_threshold > 0,
         "stage 3 gathers each module's own parameters and merges no fine-grained modules"),
        ("overlap_comm", zero.overlap_comm and stage != 2 and not overlap_refused,
         f"gradients are reduced during backward, overlapped with it, only at stage 2 (stage is {stage})"),
        ("reduce_bucket_size", _changed(zero.reduce_bucket_size, default.reduce_bucket_size) and stage != 2,
         f"only stage 2 reduces gradients in buckets (stage is {stage})"),
        ("sub_group_size", _changed(zero.sub_group_size, default.sub_group_size) and not nvme,
         "sub-groups split only the optimizer step of NVMe optimizer offload"),
        ("save_muon_momentum_buffer_in_memory", zero.save_muon_momentum_buffer_in_memory and not nvme,
         "only NVMe optimizer offload moves the momentum out of memory"),
        ("ignore_unused_parameters", not zero.ignore_unused_parameters and stage != 2,
         f"only stage 2 checks for parameters without gradients, as in DeepSpeed (stage is {stage})"),
        ("offload_optimizer.fast_init", offload is not None and offload.fast_init,
         "NVMe optimizer offload has one initialisation, with nothing to speed up"),
        ("offload_optimizer.pipeline_read", offload is not None and offload.pipeline_read,
         "the optimizer step's swap-file reads are not overlapped"),
        ("offload_optimizer.pipeline_write", offload is not None and offload.pipeline_write,
         "the optimizer step's swap-file writes always overlap the next sub-group's step"),
    )
    for key, on, why in candidates:
        if on:
            holder = offload if key.startswith("offload_optimizer.") else zero
            yield _no_effect(f"zero_optimization.{key}", why, getattr(holder, key.rsplit(".", 1)[-1]))
    if cfg.checkpoint.parallel_write.pipeline_stage:
        yield _no_effect("checkpoint.parallel_write.pipeline_stage",
                         "each pipeline stage's layer files are written by its data-parallel rank 0", True)
    comp = cfg.compile
    if not comp.deepcompile:
        defaults = type(comp)()
        for key in _DEEPCOMPILE_KNOBS:
            if getattr(comp, key) != getattr(defaults, key):
                yield _no_effect(f"compile.{key}", "a DeepCompile setting acts only with compile.deepcompile: true",
                                 getattr(comp, key))
    pipe = cfg.pipeline
    if isinstance(pipe.stages, int) and pipe.stages > 1 and cfg.tensor_parallel.autotp_size > 1:
        for key in ("pipe_partitioned", "grad_partitioned"):
            if getattr(pipe, key):
                yield _no_effect(f"pipeline.{key}", "dspipe sends activations and gradients between stages whole, "
                                                    "not partitioned over the tensor-parallel group", True)
    if not pipe.use_reentrant:
        yield _no_effect("pipeline.use_reentrant", "dstrain's activation checkpointing is non-reentrant either way "
                                                   "(the same gradients)", False)
    autocast = cfg.torch_autocast
    if autocast.enabled:
        yield _no_effect("torch_autocast.lower_precision_safe_modules",
                         f"dstrain reduces these modules' gradients in the model's dtype, not in torch_autocast.dtype "
                         f"({autocast.dtype}): it has no per-module communication dtype (communication_data_type "
                         f"reduces every gradient in one lower precision)", autocast.lower_precision_safe_modules)


# The compile section's DeepCompile settings (all but deepcompile itself and passes, which has its own rule).
_DEEPCOMPILE_KNOBS = ("free_activation", "free_activation_threshold", "offload_activation",
                      "offload_activation_pin_memory", "offload_opt_states", "offload_parameters", "double_buffer",
                      "debug_log", "sync_before_reduce", "sync_after_reduce", "sync_before_allgather",
                      "sync_after_allgather", "keep_int_input_tensors", "keep_all_input_tensors")


def compile_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    comp = cfg.compile
    # The reference's offload switches each plan against the whole memory budget: one target per run.
    if comp.offload_activation and (comp.offload_parameters or comp.offload_opt_states):
        other = "offload_parameters" if comp.offload_parameters else "offload_opt_states"
        yield _error("compile.offload_activation", f"cannot be combined with compile.{other}: choose one "
                                                   f"offloading target per run", True)
    if comp.offload_parameters and comp.offload_opt_states:
        yield _error("compile.offload_opt_states", "cannot be combined with compile.offload_parameters: choose one "
                                                   "offloading target per run", True)
    if comp.offload_opt_states and cfg.zero_optimization.optimizer_offload_device != "none":
        yield _error("compile.offload_opt_states",
                     f"cannot be combined with zero_optimization.offload_optimizer (device "
                     f"{cfg.zero_optimization.optimizer_offload_device!r}): both manage the same optimizer states; "
                     f"enable one of them", True)
    if comp.deepcompile and {"z1", "z3"} & set(comp.passes) and {"autosp", "autotp"} & set(comp.passes):
        yield _error("compile.passes", "the ZeRO passes (z1, z3) cannot be combined with autosp or autotp",
                     comp.passes)
    if comp.passes and not comp.deepcompile:
        yield Finding(Problem("compile.passes", "compiler passes run only with compile.deepcompile: true; ignored",
                              comp.passes),
                      inert=True, neutralize=lambda c: attrs.evolve(c, compile=attrs.evolve(c.compile, passes=[])))
    if comp.deepcompile and {"autotp", "long_context_checkpointing"} <= set(comp.passes):
        yield _error("compile.passes", "long_context_checkpointing runs beside autosp or the ZeRO passes, not beside "
                                       "autotp (its pass compiles the tensor-parallel graph on its own)", comp.passes)
    if "autotp" in comp.passes and cfg.tensor_parallel.autotp_size <= 1:
        yield _error("compile.passes", "the autotp pass needs tensor_parallel.autotp_size greater than 1",
                     comp.passes)
    if comp.deepcompile and not cfg.managed_gradient_accumulation:
        yield _error("managed_gradient_accumulation", "false is incompatible with compile.deepcompile", False)
    if comp.deepcompile and cfg.gradient_allreduce_op == "sum":
        yield _error("gradient_allreduce_op", "\"sum\" is not supported with DeepCompile (compile.deepcompile); "
                     "use \"mean\"", "sum")


def profiling_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    tuning = cfg.autotuning
    if tuning.end_profile_step < tuning.start_profile_step:
        yield _error("autotuning.end_profile_step",
                     f"must not be less than autotuning.start_profile_step ({tuning.start_profile_step})",
                     tuning.end_profile_step)


def monitor_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    if cfg.log_level is not None and cfg.log_level.lower() not in LOG_LEVELS:
        yield _error("log_level", f"must be one of {', '.join(LOG_LEVELS)} (any case)", cfg.log_level)
    comet = cfg.comet
    key = comet.experiment_key
    if key is not None and not (key.isalnum() and 32 <= len(key) <= 50):
        yield _error("comet.experiment_key", f"must be 32 to 50 alphanumeric characters (has {len(key)})", key)
    if comet.enabled and comet.mode == "get" and key is None:
        yield _error("comet.mode", "\"get\" continues an existing experiment and needs comet.experiment_key", "get")
    for name in ("tensorboard", "csv_monitor"):
        if not getattr(cfg, name).job_name.strip():
            yield _error(f"{name}.job_name", "must not be empty (it names the log directory)", "")


def expert_parallel_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    ep = cfg.expert_parallel
    if not ep.enabled:
        return
    world = cfg.data_parallel_size
    autotp = cfg.tensor_parallel.autotp_size
    # Beside AutoTP the experts may be split over the tensor-parallel ranks instead (autoep_size == autotp_size).
    over_tensor = autotp > 1 and ep.autoep_size == autotp
    if world % ep.autoep_size and not over_tensor:
        valid = [d for d in range(1, world + 1) if world % d == 0] + ([autotp] if autotp > 1 else [])
        yield _error("expert_parallel.autoep_size",
                     f"must divide the data-parallel size ({world})"
                     f"{f' or equal tensor_parallel.autotp_size ({autotp})' if autotp > 1 else ''}; valid sizes: "
                     f"{', '.join(str(d) for d in sorted(set(valid)))}", ep.autoep_size)
    if ep.expert_tensor_parallel_size != 1:
        yield _error("expert_parallel.expert_tensor_parallel_size", "AutoEP accepts only 1",
                     ep.expert_tensor_parallel_size)
    if ep.num_limited_groups is not None:
        if ep.num_expert_groups is None:
            yield _error("expert_parallel.num_limited_groups", "needs expert_parallel.num_expert_groups",
                         ep.num_limited_groups)
        elif ep.num_limited_groups > ep.num_expert_groups:
            yield _error("expert_parallel.num_limited_groups",
                         f"must be <= expert_parallel.num_expert_groups ({ep.num_expert_groups})",
                         ep.num_limited_groups)
    if ep.has_shared_experts and ep.shared_experts_pattern is None and ep.preset_model is None:
        yield _error("expert_parallel.shared_experts_pattern",
                     "has_shared_experts: true needs shared_experts_pattern (or a preset_model that names it)")
    if ep.moe_layer_pattern is not None:
        try:
            re.compile(ep.moe_layer_pattern)
        except re.error as exc:
            yield _error("expert_parallel.moe_layer_pattern", f"is not a valid regular expression: {exc}",
                         ep.moe_layer_pattern)
        if ep.preset_model is None:
            for key in ("router_pattern", "expert_pattern"):
                if getattr(ep, key) is None:
                    yield _error(f"expert_parallel.{key}", "a custom moe_layer_pattern without preset_model needs it")
    if ep.combine_impl == "fused_weighted_sum" and ep.score_apply == "pre":
        yield _error("expert_parallel.combine_impl", "\"fused_weighted_sum\" needs score_apply \"post\"",
                     ep.combine_impl)
    zero = cfg.zero_optimization
    if zero.stage == 3:  # the reference's constraints on AutoEP at stage 3, each by its key
        at_stage_3 = "AutoEP (expert_parallel.enabled) with ZeRO stage 3 runs without"
        if autotp > 1:
            yield _error("tensor_parallel.autotp_size", f"{at_stage_3} AutoTP; use ZeRO stage 1 or 2 beside AutoTP, "
                                                        f"or set autotp_size to 1", autotp)
        sequence = getattr(cfg, "sequence_parallel_size", 1)
        if isinstance(sequence, int) and sequence > 1:
            yield _error("sequence_parallel_size", f"{at_stage_3} sequence parallelism; set it to 1", sequence)
        if zero.zero_hpz_partition_size > 1:
            yield _error("zero_optimization.zero_hpz_partition_size", f"{at_stage_3} hpZ secondary groups; set it to "
                                                                      f"1", zero.zero_hpz_partition_size)
        if zero.zero_quantized_gradients:
            yield _error("zero_optimization.zero_quantized_gradients", f"{at_stage_3} quantized gradients; set it to "
                                                                       f"false", True)


def data_efficiency_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    de = cfg.data_efficiency
    ltd = de.data_routing.random_ltd
    base = "data_efficiency.data_routing.random_ltd"
    if ltd.random_ltd_layer_num is not None and ltd.random_ltd_layer_id and \
            len(ltd.random_ltd_layer_id) != ltd.random_ltd_layer_num:
        yield _error(f"{base}.random_ltd_layer_id",
                     f"has {len(ltd.random_ltd_layer_id)} ids but random_ltd_layer_num is {ltd.random_ltd_layer_num}",
                     ltd.random_ltd_layer_id)
    if ltd.enabled:
        yield from _required(base, ltd, ("total_layer_num", "random_ltd_layer_num", "model_type", "hidden_state_order"))
        yield from _required(f"{base}.random_ltd_schedule", ltd.random_ltd_schedule, ("min_value", "max_value"))
        yield from _required(f"{base}.random_ltd_schedule.schedule_config", ltd.random_ltd_schedule.schedule_config,
                             ("require_steps", "seq_per_step"))
        if ltd.total_layer_num is not None:
            bad = [i for i in ltd.random_ltd_layer_id if not 0 <= i < ltd.total_layer_num]
            if bad:
                yield _error(f"{base}.random_ltd_layer_id",
                             f"ids {bad} are outside 0..{ltd.total_layer_num - 1} (total_layer_num)", bad)
        sched = ltd.random_ltd_schedule
        if sched.min_value is not None and sched.max_value is not None and sched.min_value > sched.max_value:
            yield _error(f"{base}.random_ltd_schedule.min_value",
                         f"must not exceed max_value ({sched.max_value})", sched.min_value)
        # DeepSpeed runs random-LTD from this key alone, whatever data_efficiency.enabled and
        # data_routing.enabled say; dstrain does the same and its engine warns where those disagree.

    cl = de.data_sampling.curriculum_learning
    cl_base = "data_efficiency.data_sampling.curriculum_learning"
    for name, metric in cl.curriculum_metrics.items():
        yield from _curriculum_metric_rules(f"{cl_base}.curriculum_metrics.{name}", metric, cl.enabled)
    if cl.enabled:
        if not cl.curriculum_metrics:
            yield _error(f"{cl_base}.curriculum_metrics", "curriculum learning is enabled but names no metric")
        needs_clusters = any(m.clustering_type == "schedule_based" for m in cl.curriculum_metrics.values())
        if needs_clusters and cl.data_cluster_path is None:
            yield _error(f"{cl_base}.data_cluster_path", "schedule_based clustering needs a data_cluster_path")
    yield from _legacy_curriculum_rules(cfg.curriculum_learning)


def _legacy_curriculum_rules(legacy) -> Iterator[Finding]:
    if legacy.enabled:
        yield from _required("curriculum_learning", legacy, ("min_difficulty", "max_difficulty", "schedule_type"))
    yield from _schedule_rules("curriculum_learning", legacy.min_difficulty, legacy.max_difficulty,
                               legacy.schedule_type, legacy.schedule_config)


_SCHEDULE_KEYS = {
    "fixed_linear": ("total_curriculum_step", "difficulty_step"),
    "fixed_root": ("total_curriculum_step", "difficulty_step", "root_degree"),
    "fixed_discrete": ("difficulty", "max_step"),
    "custom": (),
}


def _curriculum_metric_rules(path: str, metric, enabled: bool) -> Iterator[Finding]:
    if enabled:
        yield from _required(path, metric, ("min_difficulty", "max_difficulty", "schedule_type"))
        if metric.clustering_type == "schedule_based":
            yield from _required(path, metric, ("index_to_sample_path", "index_to_metric_path"))
    lo, hi = metric.min_difficulty, metric.max_difficulty
    if metric.difficulty_type == "percentile":
        for key, value in (("min_difficulty", lo), ("max_difficulty", hi)):
            if value is not None and not 0 <= value <= 100:
                yield _error(f"{path}.{key}", "a percentile must be between 0 and 100", value)
        if hi == 0:  # the sampler cuts the samples into max_difficulty shares: none at all admits no sample
            yield _error(f"{path}.max_difficulty", "a percentile curriculum must end above 0 percent of the samples "
                                                   "(valid: 1 to 100; 100 is the whole dataset)", hi)
    yield from _schedule_rules(path, lo, hi, metric.schedule_type, metric.schedule_config)


def _schedule_rules(path: str, lo, hi, schedule, config) -> Iterator[Finding]:
    if lo is not None and hi is not None and lo > hi:
        yield _error(f"{path}.min_difficulty", f"must not exceed max_difficulty ({hi})", lo)
    if schedule is None:
        return
    yield from _required(f"{path}.schedule_config", config, _SCHEDULE_KEYS[schedule],
                         why=f"schedule_type {schedule!r} needs it")
    for key in {k for keys in _SCHEDULE_KEYS.values() for k in keys} - set(_SCHEDULE_KEYS[schedule]):
        if getattr(config, key) is not None:
            yield Finding(Problem(f"{path}.schedule_config.{key}",
                                  f"is not used by schedule_type {schedule!r}; it is ignored", getattr(config, key)),
                          inert=True)
    if schedule == "fixed_discrete" and config.difficulty is not None and config.max_step is not None \
            and len(config.max_step) != len(config.difficulty) - 1:
        yield _error(f"{path}.schedule_config.max_step",
                     f"needs one step fewer than difficulty has levels ({len(config.difficulty)} levels, "
                     f"{len(config.max_step)} steps)", config.max_step)


def _required(path: str, obj, keys, why: str = "required when enabled") -> Iterator[Finding]:
    for key in keys:
        if getattr(obj, key) is None:
            yield _error(f"{path}.{key}", f"is missing ({why})")


def tensor_parallel_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    partition = cfg.tensor_parallel.partition_config
    if partition is None:
        return
    for index, spec in enumerate(partition.layer_specs):
        path = f"tensor_parallel.partition_config.layer_specs[{index}]"
        if not spec.patterns:
            yield _error(f"{path}.patterns", "needs at least one regular expression")
        for pattern in spec.patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                yield _error(f"{path}.patterns", f"{pattern!r} is not a valid regular expression: {exc}", pattern)
        if spec.partition_dim is not None and spec.shape is None:
            yield _error(f"{path}.partition_dim", "is used only together with shape", spec.partition_dim)


def hybrid_engine_rules(cfg: DeepSpeedConfig) -> Iterator[Finding]:
    he = cfg.hybrid_engine
    if he.enabled and he.enable_cuda_graph:
        reasons = [text for cond, text in (
            (cfg.zero_optimization.stage == 3, "ZeRO stage 3"),
            (he.release_inference_cache, "release_inference_cache"),
            (he.inference_tp_size > 1, "inference_tp_size > 1")) if cond]
        if reasons:
            yield Finding(Problem("hybrid_engine.enable_cuda_graph",
                                  f"has no effect with {', '.join(reasons)}; it is ignored", True), warn_only=True)


RULES = (precision_rules, zero_rules, no_effect_rules, compile_rules, profiling_rules, monitor_rules, expert_parallel_rules,
         data_efficiency_rules, tensor_parallel_rules, hybrid_engine_rules)


def check_rules(cfg: DeepSpeedConfig) -> list[Finding]:
    return [finding for rule in RULES for finding in rule(cfg)]


__all__ = ["AUTO", "RULES", "Finding", "check_rules"]
