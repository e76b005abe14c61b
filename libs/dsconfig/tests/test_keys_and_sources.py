"""Unknown, old, unsupported and comment keys; the sources a config comes from; value types."""

import base64
import json
import sys
import warnings

import pytest

import dsconfig


def load_quiet(config, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = dsconfig.load(config, **kwargs)
    return cfg, [str(w.message) for w in caught]


# ----------------------------------------------------------------- unknown keys
def test_unknown_key_is_an_error_by_default_with_a_suggestion():
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"zero_optimisation": {"stage": 2}})
    assert info.value.paths == ["zero_optimisation"]
    assert "did you mean 'zero_optimization'" in str(info.value)


def test_unknown_key_is_a_warning_with_strict_false():
    cfg, messages = load_quiet({"zero_optimization": {"stage": 2, "overlap_com": True}}, strict=False)
    assert cfg.zero_optimization.stage == 2 and cfg.zero_optimization.overlap_comm is False
    assert messages == ["unknown keys (ignored): zero_optimization.overlap_com (did you mean 'overlap_comm'?)"]


@pytest.mark.parametrize(("key", "hint"), [
    ("comm_overlap", "did you mean 'overlap_comm'"),                 # words swapped
    ("stage3_param_persitance_threshold", "stage3_param_persistence_threshold"),
    ("gradient_clipping ", None),                                   # nested below: a key with a space
])
def test_suggestions_in_zero_section(key, hint):
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"zero_optimization": {key: 1}})
    if hint:
        assert hint in str(info.value)


def test_key_with_surrounding_spaces_is_named():
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"gradient_accumulation_steps ": 2})
    assert "surrounding spaces" in str(info.value)


def test_key_in_the_wrong_section_says_where_it_belongs():
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"stage3_max_live_parameters": 10})
    assert "zero_optimization.stage3_max_live_parameters" in str(info.value)


def test_underscore_keys_are_comments():
    cfg, messages = load_quiet({"_comment": "tuned for 8 GPUs", "zero_optimization": {"_stage": 9, "stage": 1}})
    assert cfg.zero_optimization.stage == 1 and messages == []


# ----------------------------------------------------------------- the key table
def test_old_spellings_are_read_as_the_new_keys_with_a_warning():
    with pytest.warns(dsconfig.ConfigWarning, match="bfloat16 -> bf16"):
        cfg = dsconfig.load({"bfloat16": {"enabled": True},
                             "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True,
                                                   "max_live_parameters": 7}})
    assert cfg.bf16.enabled is True
    assert cfg.zero_optimization.stage3_gather_16bit_weights_on_model_save is True
    assert cfg.zero_optimization.stage3_max_live_parameters == 7


def test_old_and_new_spelling_with_different_values_is_an_error():
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"bfloat16": {"enabled": True}, "bf16": {"enabled": False}})
    assert info.value.paths == ["bfloat16"]


def test_cpu_offload_becomes_offload_optimizer():
    with pytest.warns(dsconfig.ConfigWarning, match="cpu_offload"):
        cfg = dsconfig.load({"zero_optimization": {"stage": 3, "cpu_offload": True, "cpu_offload_params": True,
                                                   "cpu_offload_use_pin_memory": True}})
    zero = cfg.zero_optimization
    assert (zero.optimizer_offload_device, zero.param_offload_device) == ("cpu", "cpu")
    assert zero.offload_optimizer.pin_memory and zero.offload_param.pin_memory
    cfg, _ = load_quiet({"zero_optimization": {"stage": 2, "cpu_offload": False}})
    assert cfg.zero_optimization.offload_optimizer is None


def test_thread_count_and_intra_op_parallelism_are_one_setting():
    assert dsconfig.load({"aio": {"thread_count": 4}}).aio.intra_op_parallelism == 4
    cfg, messages = load_quiet({"aio": {"intra_op_parallelism": 3}})
    assert cfg.aio.thread_count == 3 and messages == []
    assert cfg.aio.handle_kwargs()["intra_op_parallelism"] == 3
    with pytest.raises(dsconfig.ConfigError):
        dsconfig.load({"aio": {"intra_op_parallelism": 3, "thread_count": 2}})


def test_unsupported_keys_error_when_strict_and_warn_once_otherwise():
    config = {"sparse_attention": {"mode": "fixed"}, "progressive_layer_drop": {"enabled": True},
              "amp": {"enabled": True}}
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(config)
    assert sorted(info.value.paths) == ["amp", "progressive_layer_drop", "sparse_attention"]
    assert "not supported by dstrain" in str(info.value)
    _, messages = load_quiet(config, strict=False)
    assert len(messages) == 1 and all(k in messages[0] for k in config)


def test_redundant_keys_warn_in_both_modes():
    for strict in (True, False):
        _, messages = load_quiet({"zero_allow_untested_optimizer": True}, strict=strict)
        assert len(messages) == 1 and "zero_allow_untested_optimizer" in messages[0]


def test_unsupported_deepspeed_optimizer():
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"optimizer": {"type": "OnebitAdam", "params": {"lr": 1e-3}}})
    assert info.value.paths == ["optimizer.type"]
    cfg, messages = load_quiet({"optimizer": {"type": "OnebitAdam", "params": {"lr": 1e-3}}}, strict=False)
    assert cfg.optimizer.type == "OneBitAdam" and "OneBitAdam" in messages[0]


# ----------------------------------------------------------------- optimizer and scheduler
def test_optimizer_names_are_canonical_and_params_checked():
    cfg = dsconfig.load({"optimizer": {"type": "adamw", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}}})
    assert cfg.optimizer.type == "AdamW" and cfg.optimizer.params["betas"] == [0.9, 0.95]
    assert dsconfig.load({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "anything": 1}}}).optimizer.type == "SGD"
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"optimizer": {"type": "Adam", "params": {"lr": "fast", "betas": [0.9]}}})
    assert info.value.paths == ["optimizer.params.lr", "optimizer.params.betas"]


def test_unknown_optimizer_name_is_an_error_with_a_suggestion():
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"optimizer": {"type": "Adamm"}}, strict=False)
    assert "did you mean" in str(info.value) and info.value.paths == ["optimizer.type"]


def test_scheduler_param_typo_is_caught():
    config = {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 100}}}
    with pytest.raises(dsconfig.ConfigError, match="warmup_num_steps"):
        dsconfig.load(config)
    cfg = dsconfig.load({"scheduler": {"type": "warmupdecaylr", "params": {"total_num_steps": "auto"}}})
    assert cfg.scheduler.type == "WarmupDecayLR" and "scheduler.params.total_num_steps" in cfg.unresolved_auto()


# ----------------------------------------------------------------- value types
@pytest.mark.parametrize(("config", "path"), [
    ({"fp16": {"enabled": "true"}}, "fp16.enabled"),
    ({"fp16": {"enabled": 1}}, "fp16.enabled"),
    ({"zero_optimization": {"stage": "2"}}, "zero_optimization.stage"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage"),
    ({"zero_optimization": {"stage": True}}, "zero_optimization.stage"),
    ({"zero_optimization": {"reduce_bucket_size": 5.5e8 + 0.5}}, "zero_optimization.reduce_bucket_size"),
    ({"zero_optimization": {"offload_param": {"device": "gpu"}}}, "zero_optimization.offload_param.device"),
    ({"steps_per_print": 0}, "steps_per_print"),
    ({"gradient_clipping": -1}, "gradient_clipping"),
    ({"comms_logger": {"prof_ops": ["all_reduce", "allreduce"]}}, "comms_logger.prof_ops[1]"),
    ({"optimizer": "Adam"}, "optimizer"),
    ({"tensorboard": {"output_path": 3}}, "tensorboard.output_path"),
])
def test_invalid_values_are_errors_in_both_modes(config, path):
    for strict in (True, False):
        with pytest.raises(dsconfig.ConfigError) as info:
            dsconfig.load(config, strict=strict)
        assert info.value.paths == [path], str(info.value)


def test_quoted_booleans_and_numbers_get_a_hint():
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({"fp16": {"enabled": "true"}, "train_micro_batch_size_per_gpu": "8"})
    assert "write true without quotes" in str(info.value) and "write 8 without quotes" in str(info.value)


def test_byte_sizes_in_exponent_notation_are_integers():
    cfg = dsconfig.load({"zero_optimization": {"reduce_bucket_size": 5e8, "sub_group_size": 1e14}})
    assert cfg.zero_optimization.reduce_bucket_size == 500_000_000
    assert type(cfg.zero_optimization.sub_group_size) is int


def test_enum_spelling_is_canonicalised():
    cfg = dsconfig.load({"checkpoint": {"tag_validation": "fail"}, "autotuning": {"metric": "FLOPS"},
                         "torch_autocast": {"enabled": True, "dtype": "torch.float16"}})
    assert (cfg.checkpoint.tag_validation, cfg.autotuning.metric, cfg.torch_autocast.dtype) == \
        ("Fail", "flops", "float16")


def test_null_section_means_defaults():
    cfg = dsconfig.load({"zero_optimization": {"offload_optimizer": None}, "fp16": None})
    assert cfg.zero_optimization.offload_optimizer is None and cfg.fp16.enabled is False


# ----------------------------------------------------------------- sources
def test_path_dict_base64_and_pathlike_give_equal_configs(tmp_path):
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    encoded = base64.urlsafe_b64encode(json.dumps(config).encode()).decode()
    loaded = [dsconfig.load(config), dsconfig.load(str(path)), dsconfig.load(path), dsconfig.load(encoded),
              dsconfig.load(base64.b64encode(json.dumps(config).encode()).decode())]
    assert all(cfg == loaded[0] for cfg in loaded)


def test_duplicate_keys_are_refused_with_both_lines(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{\n  "zero_optimization": {\n    "stage": 1,\n    "overlap_comm": true,\n'
                    '    "stage": 3\n  }\n}\n')
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(path)
    message = str(info.value)
    assert "stage" in info.value.paths[0] and "lines 3 and 5" in message and str(path) in message


HJSON = """// tuned for 8 GPUs
{
  train_batch_size: 16
  # a comment of another kind
  /* a block
     comment */
  "zero_optimization": {"stage": 2, "overlap_comm": true,},
  optimizer: {
    type: AdamW
    params: {lr: 1e-4}
  }
}
"""


def test_hjson_that_deepspeed_reads_loads_the_same(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(HJSON)
    cfg = dsconfig.load(path, world_size=2)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.zero_optimization.stage) == (16, 8, 2)
    assert cfg.zero_optimization.overlap_comm and cfg.optimizer.type == "AdamW" and cfg.optimizer.params["lr"] == 1e-4
    path.write_text('"optimizer": {"type": "Adam", "params": {"lr": 0.1}}\n"train_batch_size": 4')  # braces left out
    assert dsconfig.load(path).optimizer.type == "Adam"
    path.write_text("{\n  train_batch_size: 4\n  train_batch_size: 8\n}")
    with pytest.raises(dsconfig.ConfigError, match="train_batch_size: appears twice"):
        dsconfig.load(path)
    path.write_text("{\n  train_batch_size: CONFIG_BATCH_SIZE\n}")  # a placeholder on its own line: a string
    with pytest.raises(dsconfig.ConfigError, match="train_batch_size = 'CONFIG_BATCH_SIZE'"):
        dsconfig.load(path)
    path.write_text("{\n  // a comment\n  train_batch_size: " + "7" * 5000 + "\n}")  # limits hold here too
    with pytest.raises(dsconfig.ConfigError, match="train_batch_size"):
        dsconfig.load(path)


def test_without_hjson_json_still_loads_and_other_text_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "hjson", None)  # an install without it (e.g. --no-deps): import fails
    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 4}')
    assert dsconfig.load(path).train_batch_size == 4
    path.write_text('{\n  // a comment\n  "train_batch_size": 4\n}')
    with pytest.raises(dsconfig.ConfigError, match=r"comments.*DeepSpeed reads such files with hjson.*pip install hjson"):
        dsconfig.load(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(dsconfig.ConfigError, match="no such config file"):
        dsconfig.load(tmp_path / "nope.json")


@pytest.mark.parametrize(("text", "hint"), [
    ('{"train_batch_size": CONFIG_BATCH_SIZE}', "placeholder"),
    ('{"train_batch_size": ${batch}}', "placeholder"),
    ('{"tag_validation"="Warn"}', "':'"),
    ('[1, 2]', "must be a JSON object"),
])
def test_not_json_gets_a_reason(tmp_path, text, hint):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(path)
    assert hint in str(info.value)


def test_source_of_wrong_type():
    with pytest.raises(dsconfig.ConfigError, match="not int"):
        dsconfig.load(42)


# ----------------------------------------------------------------- round trip
def test_to_dict_round_trips_a_rich_config():
    config = {"train_batch_size": 64, "gradient_accumulation_steps": 2, "optimizer": {"type": "Muon"},
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}},
              "data_efficiency": {"data_sampling": {"curriculum_learning": {"curriculum_metrics": {
                  "seqlen": {"min_difficulty": 1, "max_difficulty": 9}}}}},
              "tensor_parallel": {"partition_config": {"layer_specs": [{"patterns": ["a"], "shape": [2, -1],
                                                                         "partition_dim": 0}]}}}
    cfg = dsconfig.load(config, world_size=4)
    again = dsconfig.load(cfg.to_dict(), world_size=4)
    assert again == cfg and again.to_dict() == cfg.to_dict()
    json.dumps(cfg.to_dict())  # plain JSON data


def test_configs_are_frozen():
    cfg = dsconfig.load({})
    with pytest.raises(AttributeError):
        cfg.zero_optimization.stage = 3
