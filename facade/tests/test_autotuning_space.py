"""The autotuner's pure parts, without processes: the tuning space for each `fast` setting, the batch
triple under max_train_batch_size and a fixed train_batch_size, what the user's config asks for, the
experiment and optimal configs, the script's command line, and the memory estimate."""

import json
from pathlib import Path

import pytest

from dsconfig import ConfigError
from dstrain.autotuning import BatchLimits, Point, features, knob_dimensions, parse_stages, stage_points
from dstrain.autotuning.batches import tuning_micro_batches
from dstrain.autotuning.configs import config_problems, experiment_config, optimal_config
from dstrain.autotuning.errors import AutotuningError
from dstrain.autotuning.memory import ModelInfo, largest_fitting_micro_batch, model_state_bytes
from dstrain.autotuning.request import read_request
from dstrain.autotuning.script_args import (
    check_arg_mappings,
    config_argument,
    mapped_value,
    with_config,
    with_mapped_values,
)
from dstrain.autotuning.space import unread_lists

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "configs" / "zero2.json"


# ---------------------------------------------------------------------------- the space
def test_fast_tunes_only_stages_and_micro_batches():
    zero = {"stage": 2, "overlap_comm": [True, False], "reduce_bucket_size": "auto"}
    for stage in range(4):
        assert knob_dimensions(stage, zero, fast=True) == {}
    points = stage_points(2, [(2, 1, 4), (4, 1, 8)], knob_dimensions(2, zero, fast=True))
    assert [p.name for p in points] == ["z2_gas1_tmbspg2", "z2_gas1_tmbspg4"]


def test_full_space_tunes_the_knobs_dszero_reads_at_each_stage():
    dims = {stage: knob_dimensions(stage, {}, fast=False) for stage in range(4)}
    assert dims[0] == {} and dims[1] == {}  # one flat buffer reduced: no knob changes speed
    assert dims[2] == {"overlap_comm": (True, False), "reduce_bucket_size": (50_000_000, 500_000_000, 1_000_000_000)}
    assert set(dims[3]) == {"stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"}
    points = stage_points(2, [(2, 1, 4), (4, 1, 8)], dims[2])
    assert len(points) == 2 * 2 * 3 and len({p.name for p in points}) == 12
    assert points[0].name == "z2_gas1_tmbspg2_oc1_rbs5e7"


def test_the_users_values_narrow_or_widen_the_space_as_deepspeeds_do():
    zero = {"overlap_comm": False, "reduce_bucket_size": [1000, 2000], "contiguous_gradients": [True, False],
            "stage3_max_live_parameters": [10**8, 10**9]}
    dims = knob_dimensions(2, zero, fast=False)
    assert "overlap_comm" not in dims  # a single value fixes the knob
    assert dims["reduce_bucket_size"] == (1000, 2000)  # a list is the candidates
    assert "contiguous_gradients" not in dims and "stage3_max_live_parameters" not in dims  # not read at stage 2
    assert unread_lists(2, zero) == ["contiguous_gradients", "stage3_max_live_parameters"]
    stage3 = knob_dimensions(3, zero, fast=False)
    assert stage3["stage3_max_live_parameters"] == (10**8, 10**9)  # a list on a key the stage reads widens it
    assert "reduce_bucket_size" not in stage3
    assert knob_dimensions(2, {"reduce_bucket_size": "auto"}, fast=False)["reduce_bucket_size"][0] == 50_000_000


def test_offload_is_tuned_only_where_configured_and_possible():
    zero = {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    assert "offload_optimizer.device" not in knob_dimensions(0, zero, fast=False)
    assert knob_dimensions(1, zero, fast=False)["offload_optimizer.device"] == ("cpu", "none")
    assert "offload_param.device" not in knob_dimensions(2, zero, fast=False)
    assert knob_dimensions(3, zero, fast=False)["offload_param.device"] == ("cpu", "none")
    assert "offload_optimizer.device" not in knob_dimensions(2, {}, fast=False)


def test_buckets_larger_than_the_model_collapse_to_one():
    dims = knob_dimensions(2, {}, fast=False, num_params=100_000_000)
    assert dims["reduce_bucket_size"] == (50_000_000, 500_000_000)
    assert knob_dimensions(2, {}, fast=False, num_params=1_000)["reduce_bucket_size"] == (50_000_000,)


def test_stages_from_the_config():
    assert parse_stages({}) == ((0, 1, 2, 3), False)
    assert parse_stages({"stage": "all"}) == ((0, 1, 2, 3), False)
    assert parse_stages({"stage": 2}) == ((2,), True)
    assert parse_stages({"stage": [3, 1, 1]}) == ((1, 3), True)
    with pytest.raises(ConfigError, match=r"zero_optimization\.stage"):
        parse_stages({"stage": [1, 4]})


def test_features_scale_each_varying_column_into_the_unit_interval():
    points = stage_points(2, [(1, 1, 1), (16, 1, 16)], {"overlap_comm": (True, False), "reduce_bucket_size": (10, 1000)})
    rows = features(points)
    assert len(rows) == len(points) and all(len(r) == 3 for r in rows)  # micro-batch, overlap, bucket (gas constant)
    assert all(0.0 <= v <= 1.0 for r in rows for v in r)
    assert rows[0] == [0.0, 1.0, 0.0] and rows[-1] == [1.0, 0.0, 1.0]


def test_experiment_names_are_plain_file_names():
    point = Point(3, 8, 2, 32, (("offload_param.device", "cpu"), ("stage3_param_persistence_threshold", 100_000)))
    assert point.name == "z3_gas2_tmbspg8_opcpu_ppt1e5"
    assert "/" not in Point(0, 1, 1, 1, (("offload_optimizer.device", "../../etc"),)).name  # values are cleaned
    with pytest.raises(ValueError, match="characters"):
        _ = Point(0, 1, 1, 1, (("a/b", 1),)).name  # a key from a user's list that is no plain name


# ---------------------------------------------------------------------------- batch sizes
def test_max_train_batch_size_bounds_every_triple():
    limits = BatchLimits(data_parallel=2, max_train_batch_size=64)
    assert limits.largest_micro_batch() == 32
    for micro in range(1, 1025):
        triple = limits.triple(micro)
        if micro > 32:
            assert triple is None
            continue
        mb, gas, tb = triple
        assert tb == mb * gas * 2 <= 64 and gas >= 1


def test_a_fixed_train_batch_size_is_kept():
    limits = BatchLimits(data_parallel=2, train_batch_size=48)
    usable = [m for m in range(1, 100) if limits.triple(m)]
    assert usable == [1, 2, 3, 4, 6, 8, 12, 24]
    assert {limits.triple(m)[2] for m in usable} == {48}


def test_without_limits_the_users_accumulation_is_kept():
    limits = BatchLimits(data_parallel=4, gradient_accumulation_steps=3)
    assert limits.triple(5) == (5, 3, 60) and limits.largest_micro_batch() == 1024


def test_impossible_batch_limits_are_refused_by_key():
    with pytest.raises(ConfigError, match="train_batch_size = 50: is not divisible by the data-parallel size 4"):
        BatchLimits(data_parallel=4, train_batch_size=50)
    with pytest.raises(ConfigError, match=r"autotuning\.max_train_batch_size = 2: is below the data-parallel size 4"):
        BatchLimits(data_parallel=4, max_train_batch_size=2)


def test_tuning_micro_batches_spread_from_half_the_largest():
    limits = BatchLimits(data_parallel=1)
    assert tuning_micro_batches(limits, 1, 40, 3) == [20, 30, 40]
    assert tuning_micro_batches(limits, 30, 40, 3) == [30, 35, 40]
    assert tuning_micro_batches(limits, 1, 2, 3) == [1, 2]
    assert tuning_micro_batches(BatchLimits(1, train_batch_size=48), 1, 48, 3) == [24, 48]


# ---------------------------------------------------------------------------- the user's config
def test_the_request_reads_lists_autos_and_the_scripts_flags():
    raw = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "autotuning": {"enabled": True, "metric": "FLOPS", "max_train_batch_size": 64,
                          "arg_mappings": {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
                                           "gradient_accumulation_steps ": "--gradient_accumulation_steps"}}}
    request = read_request(raw, world_size=4, script_args=["--per_device_train_batch_size", "3",
                                                           "--gradient_accumulation_steps=2"])
    assert request.metric == "flops" and request.min_micro_batch == 3 and request.limits.gradient_accumulation_steps == 2
    assert request.stages == (0, 1, 2, 3) and request.limits.max_train_batch_size == 64
    listed = read_request({"train_micro_batch_size_per_gpu": [16, 4, 8], "zero_optimization": {"stage": 1}},
                          world_size=2)
    assert listed.micro_batches == (4, 8, 16) and listed.stages == (1,)


def test_the_request_refuses_what_it_cannot_tune_by_key():
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        read_request({"gradient_accumulation_steps": [1, 2]}, world_size=1)
    with pytest.raises(ConfigError, match=r"autotuning\.arg_mappings\.train_micro_batch_size_per_gpu"):
        read_request({"autotuning": {"arg_mappings": {"train_micro_batch_size_per_gpu": "per_device_bs"}}},
                     world_size=1)
    with pytest.raises(ConfigError, match=r"autotuning\.tuner_type"):
        read_request({"autotuning": {"tuner_type": "bayes"}}, world_size=1)
    with pytest.raises(ConfigError, match=r"autotuning\.mp_size"):
        read_request({"autotuning": {"mp_size": 3}}, world_size=4)


def test_experiment_and_optimal_configs():
    raw = json.loads(EXAMPLE.read_text())
    raw["zero_optimization"] = {"stage": [1, 2], "overlap_comm": [True, False], "offload_param": {"device": "cpu"}}
    raw["autotuning"] = {"enabled": True, "end_profile_step": 4}
    point = Point(2, 4, 2, 16, (("overlap_comm", False),))
    exp = experiment_config(raw, point)
    assert exp["zero_optimization"] == {"stage": 2, "overlap_comm": False}  # no parameter offload below stage 3
    assert (exp["train_micro_batch_size_per_gpu"], exp["gradient_accumulation_steps"], exp["train_batch_size"]) == \
        (4, 2, 16)
    assert exp["tensorboard"]["enabled"] is False and exp["csv_monitor"]["enabled"] is False
    assert exp["autotuning"] == {"enabled": True, "end_profile_step": 4}
    assert config_problems(exp, 2) == []
    best = optimal_config(raw, point)
    assert "autotuning" not in best and best["tensorboard"]["enabled"] is True
    assert raw["zero_optimization"]["stage"] == [1, 2]  # the user's config is left as it was
    problems = config_problems({**best, "train_batch_size": 17}, 2)
    assert problems and problems[0].path == "train_batch_size"


# ---------------------------------------------------------------------------- the script's command line
def test_the_config_argument_in_each_spelling():
    assert config_argument(["--x", "1", "--deepspeed_config", "a.json"]) == (3, "a.json")
    assert config_argument(["--deepspeed_config=a.json"]) == (0, "a.json")
    assert config_argument(["--deepspeed", "--deepspeed_config", "b.json"]) == (2, "b.json")
    assert config_argument(["--deepspeed", "hf.json"]) == (1, "hf.json")  # Hugging Face's form
    assert with_config(["--deepspeed_config=a.json", "--steps", "3"], "/r/x.json") == \
        ["--deepspeed_config=/r/x.json", "--steps", "3"]
    with pytest.raises(AutotuningError, match="--deepspeed_config FILE"):
        config_argument(["--deepspeed", "--steps", "3"])


def test_arg_mappings_set_the_scripts_flags():
    assert check_arg_mappings({"train_micro_batch_size_per_gpu ": "--bs"}) == {"train_micro_batch_size_per_gpu": "--bs"}
    args = ["--bs", "2", "--lr=3", "--bs=5"]
    assert mapped_value(args, "--bs") == "5"
    assert with_mapped_values(args, {"--bs": 8, "--gas": 2.0}) == ["--bs", "8", "--lr=3", "--bs=8", "--gas", "2"]


# ---------------------------------------------------------------------------- memory
def test_model_states_follow_dszeros_estimators():
    n = 1_000_000
    by_stage = [model_state_bytes(stage, n, 10_000, 4) for stage in range(4)]
    assert by_stage[0] == 16 * n and by_stage == sorted(by_stage, reverse=True)
    assert by_stage[2] == 2 * n + 14 * n // 4  # dszero.estimators.zero2_estimates, no offload
    assert model_state_bytes(2, n, 0, 4, offload_optimizer=True) < by_stage[2]


def test_the_estimate_bounds_the_micro_batch():
    info = ModelInfo(num_params=1_000_000, largest_layer_params=10_000, device_memory_bytes=100_000_000,
                     activation_bytes_per_sample=1_000_000)
    assert largest_fitting_micro_batch(0, info, 2) == (90_000_000 - 16_000_000) // 1_000_000
    assert largest_fitting_micro_batch(3, info, 2) > largest_fitting_micro_batch(0, info, 2)
    assert largest_fitting_micro_batch(0, ModelInfo(1, 0, 100, 0.0), 2) is None  # activations not measured
    assert ModelInfo.from_metrics({"num_params": 5}) is None


# ---------------------------------------------------------------------------- the launcher's flags
def test_experiments_get_the_launcher_options_less_the_autotuning_ones():
    from dstrain.autotuning.command import launcher_options
    from dstrain.launcher.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["--num_procs", "2", "--autotuning", "run", "--autotuning_timeout", "60",
                              "--master_port", "1234", "--bind_cores_to_rank", "train.py", "--deepspeed_config", "x"])
    assert args.autotuning == "run" and args.script_args == ["--deepspeed_config", "x"]
    assert launcher_options(parser, args) == ["--num_procs", "2", "--master_port", "1234", "--bind_cores_to_rank"]
    assert parser.parse_args(["train.py"]).autotuning is None


def test_autotuning_refuses_what_it_cannot_run(tmp_path, capsys, monkeypatch):
    from dstrain.launcher.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps({"gradient_accumulation_steps": [1, 2]}))
    assert main(["--autotuning", "tune", "--no_ssh", "--node_rank", "0", "t.py", "--deepspeed_config", "ds.json"]) == 2
    assert "does not combine with --no_ssh" in capsys.readouterr().err
    assert main(["--autotuning", "tune", "t.py", "--steps", "3"]) == 2
    assert "--deepspeed_config FILE" in capsys.readouterr().err
    assert main(["--autotuning", "tune", "t.py", "--deepspeed_config", "ds.json"]) == 2
    assert "gradient_accumulation_steps" in capsys.readouterr().err
    assert not (tmp_path / "autotuning_exps").exists()  # nothing was launched or written
