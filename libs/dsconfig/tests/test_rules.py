"""Each cross-field rule of the reference: a config that breaks it, and the dotted path in the error."""

import warnings

import pytest

import dsconfig

Z3 = {"stage": 3}
CURRICULUM = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen"


def metric(schedule_type, **schedule_config):
    return {"data_efficiency": {"enabled": True, "data_sampling": {"enabled": True, "curriculum_learning": {
        "enabled": True, "data_cluster_path": "/tmp/clusters", "curriculum_metrics": {"seqlen": {
            "index_to_sample_path": "/tmp/i2s", "index_to_metric_path": "/tmp/i2m", "difficulty_type": "value",
            "clustering_type": "schedule_based", "min_difficulty": 8, "max_difficulty": 1024,
            "schedule_type": schedule_type, "schedule_config": schedule_config}}}}}}


def percentile_metric(low, high):
    config = metric("fixed_linear", total_curriculum_step=100, difficulty_step=1)
    seqlen = config["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["seqlen"]
    seqlen.update(difficulty_type="percentile", min_difficulty=low, max_difficulty=high)
    return config


def random_ltd(**overrides):
    ltd = {"enabled": True, "total_layer_num": 4, "random_ltd_layer_num": 2, "random_ltd_layer_id": [1, 2],
           "model_mask_name": "attention_mask", "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
           "random_ltd_schedule": {"min_value": 16, "max_value": 128, "schedule_type": "fixed_linear",
                                   "schedule_config": {"require_steps": 100, "seq_per_step": 8}}}
    ltd.update(overrides)
    return {"data_efficiency": {"enabled": True, "data_routing": {"enabled": True, "random_ltd": ltd}}}


def autoep(**overrides):
    return {"expert_parallel": {"enabled": True, "preset_model": "mixtral", **overrides}}


BROKEN = [
    ("fp16 and bf16 both on", {"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "bf16.enabled"),
    ("sum allreduce with stage 3", {"gradient_allreduce_op": "sum", "zero_optimization": Z3}, "gradient_allreduce_op"),
    ("bf16 optimizer states without bf16 master weights",
     {"bf16": {"enabled": True, "bf16_optimizer_states": True}, "zero_optimization": {"stage": 1}},
     "bf16.bf16_optimizer_states"),
    ("bf16 master weights at stage 0", {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True,
                                                 "bf16_optimizer_states": True}}, "bf16.bf16_master_weights_and_grads"),
    ("bf16 master weights with fp32 states needs offload",
     {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}, "zero_optimization": {"stage": 2}},
     "bf16.bf16_master_weights_and_grads"),
    ("fp16 master weights without stage 2/3 offload",
     {"fp16": {"enabled": True, "fp16_master_weights_and_grads": True}, "zero_optimization": {"stage": 2}},
     "fp16.fp16_master_weights_and_grads"),
    ("fp16 master weights at stage 1 with offload",
     {"fp16": {"enabled": True, "fp16_master_weights_and_grads": True},
      "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}},
     "fp16.fp16_master_weights_and_grads"),
    ("random-LTD ids and count differ", random_ltd(random_ltd_layer_id=[1, 2, 3]),
     "data_efficiency.data_routing.random_ltd.random_ltd_layer_id"),
    ("random-LTD id outside the model", random_ltd(random_ltd_layer_id=[1, 7]),
     "data_efficiency.data_routing.random_ltd.random_ltd_layer_id"),
    ("random-LTD without its layer count", random_ltd(total_layer_num=None),
     "data_efficiency.data_routing.random_ltd.total_layer_num"),
    ("autotuning end before start", {"autotuning": {"start_profile_step": 5, "end_profile_step": 3}},
     "autotuning.end_profile_step"),
    ("AutoEP size not dividing the world", autoep(autoep_size=3), "expert_parallel.autoep_size"),
    ("AutoEP expert TP", autoep(expert_tensor_parallel_size=2), "expert_parallel.expert_tensor_parallel_size"),
    ("AutoEP load-balance coefficient", autoep(load_balance_coeff=0.001), "expert_parallel.load_balance_coeff"),
    ("AutoEP limited groups above groups", autoep(num_expert_groups=2, num_limited_groups=4),
     "expert_parallel.num_limited_groups"),
    ("AutoEP with AutoTP at ZeRO-3", {**autoep(), "tensor_parallel": {"autotp_size": 2},
                                      "zero_optimization": {"stage": 3}}, "tensor_parallel.autotp_size"),
    ("AutoEP at ZeRO-3 with hpZ", {**autoep(), "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}},
     "zero_optimization.zero_hpz_partition_size"),
    ("AutoEP custom layer pattern without router", autoep(preset_model=None, moe_layer_pattern="model\\.moe",
                                                          expert_pattern="experts"),
     "expert_parallel.router_pattern"),
    ("AutoEP with ZeRO-3 quantized gradients",
     {**autoep(), "zero_optimization": {"stage": 3, "zero_quantized_gradients": True}},
     "zero_optimization.zero_quantized_gradients"),
    ("fixed_linear without total_curriculum_step", metric("fixed_linear", difficulty_step=8),
     f"{CURRICULUM}.schedule_config.total_curriculum_step"),
    ("fixed_root without root_degree", metric("fixed_root", total_curriculum_step=100, difficulty_step=8),
     f"{CURRICULUM}.schedule_config.root_degree"),
    ("fixed_discrete without max_step", metric("fixed_discrete", difficulty=[8, 64]),
     f"{CURRICULUM}.schedule_config.max_step"),
    ("fixed_discrete with one step too many", metric("fixed_discrete", difficulty=[8, 64], max_step=[10, 20]),
     f"{CURRICULUM}.schedule_config.max_step"),
    ("percentile curriculum ending at 0 percent", percentile_metric(0, 0), f"{CURRICULUM}.max_difficulty"),
    ("comet experiment_key too short", {"comet": {"experiment_key": "abc"}}, "comet.experiment_key"),
    ("comet get without a key", {"comet": {"enabled": True, "mode": "get"}}, "comet.mode"),
    ("autotp pass without AutoTP", {"compile": {"deepcompile": True, "passes": ["autotp"]}}, "compile.passes"),
    ("long-context checkpointing beside autotp", {"tensor_parallel": {"autotp_size": 2}, "compile": {
        "deepcompile": True, "passes": ["autotp", "long_context_checkpointing"]}}, "compile.passes"),
    ("unmanaged accumulation with overlap at stage 1",
     {"managed_gradient_accumulation": False, "zero_optimization": {"stage": 1, "overlap_comm": True}},
     "zero_optimization.overlap_comm"),
    ("unmanaged accumulation with DeepCompile",
     {"managed_gradient_accumulation": False, "compile": {"deepcompile": True}}, "managed_gradient_accumulation"),
    ("gradient sum with DeepCompile", {"gradient_allreduce_op": "sum", "compile": {"deepcompile": True}},
     "gradient_allreduce_op"),
    ("activation and parameter offload together",
     {"compile": {"deepcompile": True, "offload_activation": True, "offload_parameters": True}},
     "compile.offload_activation"),
    ("activation and optimizer-state offload together",
     {"compile": {"deepcompile": True, "offload_activation": True, "offload_opt_states": True}},
     "compile.offload_activation"),
    ("parameter and optimizer-state offload together",
     {"compile": {"deepcompile": True, "offload_parameters": True, "offload_opt_states": True}},
     "compile.offload_opt_states"),
    ("optimizer-state offload beside ZeRO's optimizer offload",
     {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
      "compile": {"deepcompile": True, "offload_opt_states": True}}, "compile.offload_opt_states"),
    ("ZeRO pass beside autotp", {"tensor_parallel": {"autotp_size": 2},
                                 "compile": {"deepcompile": True, "passes": ["z3", "autotp"]}}, "compile.passes"),
    ("TP rule with a bad regex", {"tensor_parallel": {"autotp_size": 2, "partition_config": {
        "layer_specs": [{"patterns": ["(unclosed"], "partition_type": "row"}]}}},
     "tensor_parallel.partition_config.layer_specs[0].patterns"),
]


@pytest.mark.parametrize(("name", "config", "path"), BROKEN, ids=[b[0] for b in BROKEN])
def test_rule_is_enforced(name, config, path):
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(config, world_size=8, strict=False)
    assert path in info.value.paths, str(info.value)


@pytest.mark.parametrize(("name", "config", "path"), BROKEN, ids=[b[0] for b in BROKEN])
def test_error_message_names_the_path(name, config, path):
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(config, world_size=8)
    assert f"  - {path}" in str(info.value)


INERT = [
    ("parameter offload below stage 3", {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
     "zero_optimization.offload_param", lambda c: c.zero_optimization.offload_param is None),
    ("optimizer offload at stage 0", {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
     "zero_optimization.offload_optimizer", lambda c: c.zero_optimization.offload_optimizer is None),
    ("hpZ below stage 3", {"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}},
     "zero_optimization.zero_hpz_partition_size", lambda c: c.zero_optimization.zero_hpz_partition_size == 1),
    ("qwZ below stage 3", {"zero_optimization": {"stage": 1, "zero_quantized_weights": True}},
     "zero_optimization.zero_quantized_weights", lambda c: not c.zero_optimization.zero_quantized_weights),
    ("qgZ below stage 3", {"zero_optimization": {"stage": 2, "zero_quantized_gradients": True}},
     "zero_optimization.zero_quantized_gradients", lambda c: not c.zero_optimization.zero_quantized_gradients),
    ("passes without DeepCompile", {"compile": {"passes": ["autosp"]}}, "compile.passes",
     lambda c: c.compile.passes == []),
    ("root_degree with fixed_linear", metric("fixed_linear", total_curriculum_step=10, difficulty_step=8,
                                             root_degree=2), f"{CURRICULUM}.schedule_config.root_degree",
     lambda c: True),
]


@pytest.mark.parametrize(("name", "config", "path", "check"), INERT, ids=[i[0] for i in INERT])
def test_setting_without_effect_is_an_error_when_strict_and_removed_with_a_warning_otherwise(name, config, path, check):
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(config, strict=True)
    assert path in info.value.paths
    with pytest.warns(dsconfig.ConfigWarning, match=path.replace("[", r"\[").replace(".", r"\.")):
        cfg = dsconfig.load(config, strict=False)
    assert check(cfg)


def test_cuda_graph_with_stage3_only_warns_in_both_modes():
    config = {"hybrid_engine": {"enabled": True, "enable_cuda_graph": True}, "zero_optimization": Z3}
    for strict in (True, False):
        with pytest.warns(dsconfig.ConfigWarning, match="enable_cuda_graph"):
            dsconfig.load(config, strict=strict)


def test_every_problem_is_reported_at_once():
    config = {"fp16": {"enabled": True}, "bf16": {"enabled": True}, "gradient_allreduce_op": "sum",
              "zero_optimization": Z3, "autotuning": {"start_profile_step": 9, "end_profile_step": 1}}
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(config)
    assert set(info.value.paths) == {"bf16.enabled", "gradient_allreduce_op", "autotuning.end_profile_step"}


def test_valid_combinations_load_silently():
    valid = [
        {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
         "zero_optimization": {"stage": 1}},
        {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True},
         "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
        {"fp16": {"enabled": True, "fp16_master_weights_and_grads": True},
         "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}},
        random_ltd(),
        metric("fixed_root", total_curriculum_step=100, difficulty_step=8, root_degree=2),
        metric("fixed_discrete", difficulty=[8, 64, 1024], max_step=[10, 20]),
        metric("custom"),
        autoep(autoep_size=4, num_expert_groups=4, num_limited_groups=2),
        {"gradient_allreduce_op": "sum", "zero_optimization": {"stage": 2}},
        {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}},
        {"sequence_parallel_size": 2, "compile": {"deepcompile": True,
                                                  "passes": ["autosp", "long_context_checkpointing"]}},
        {"zero_optimization": {"stage": 3}, "compile": {"deepcompile": True, "passes": ["long_context_checkpointing"]}},
    ]
    for config in valid:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dsconfig.load(config, world_size=8)


def test_nvme_optimizer_offload_is_allowed_at_stages_1_and_2():
    # dszero swaps the partitioned optimizer state to NVMe at every partitioning stage (its tests say so).
    for stage in (1, 2):
        cfg = dsconfig.load({"train_batch_size": 4, "zero_optimization": {
            "stage": stage, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}})
        assert cfg.zero_optimization.optimizer_offload_device == "nvme"


LEGACY = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 1024,
          "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 60000, "difficulty_step": 8}}


def test_the_legacy_curriculum_section_is_parsed_and_checked():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        legacy = dsconfig.load({"train_batch_size": 8, "curriculum_learning": LEGACY}).curriculum_learning
    assert (legacy.enabled, legacy.curriculum_type, legacy.min_difficulty, legacy.max_difficulty) == \
        (True, "seqlen", 8, 1024)
    assert legacy.schedule_config.total_curriculum_step == 60000
    assert dsconfig.requested_unsupported({"curriculum_learning": LEGACY}) == []
    broken = {**LEGACY, "schedule_config": {"difficulty_step": 8}, "min_difficulty": 2048}
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"train_batch_size": 8, "curriculum_learning": broken})
    assert set(info.value.paths) == {"curriculum_learning.schedule_config.total_curriculum_step",
                                     "curriculum_learning.min_difficulty"}
    with pytest.raises(dsconfig.ConfigError, match="curriculum_type"):
        dsconfig.load({"train_batch_size": 8, "curriculum_learning": {**LEGACY, "curriculum_type": "vocab"}})


def test_random_ltd_runs_from_its_own_key_as_in_deepspeed():
    # DeepSpeed reads only random_ltd.enabled; the master switches do not turn it off (the engine warns).
    alone = {"data_efficiency": {"data_routing": {"random_ltd": random_ltd()["data_efficiency"]["data_routing"]
                                                  ["random_ltd"]}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = dsconfig.load(alone, strict=True)
    assert cfg.data_efficiency.data_routing.random_ltd.enabled and "random-LTD" in cfg.enabled_features()


def test_zeropp_at_stage_3_loads_and_is_named_among_the_features():
    cfg = dsconfig.load({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2, "zero_quantized_weights": True,
                                               "zero_quantized_gradients": True}}, world_size=4, strict=True)
    assert "ZeRO++ (hpZ, qwZ, qgZ)" in cfg.enabled_features()


def test_autoep_beside_autotp_is_accepted_below_stage_3():
    # beyond the reference: experts over the tensor ranks (autoep_size == autotp_size, even when it does not
    # divide the data-parallel size) or over the data ranks; at stage 3 the reference's refusal holds
    for autoep_size, data in ((2, 3), (3, 3)):
        cfg = {**autoep(autoep_size=autoep_size), "tensor_parallel": {"autotp_size": 2},
               "zero_optimization": {"stage": 2}}
        dsconfig.load(cfg, world_size=data)
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({**autoep(autoep_size=2), "tensor_parallel": {"autotp_size": 4}}, world_size=3)
    assert "expert_parallel.autoep_size" in info.value.paths and "tensor_parallel.autotp_size (4)" in str(info.value)
