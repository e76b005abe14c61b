"""`dsconfig check | schema | defaults`, run as a user runs them (a subprocess)."""

import json
import subprocess
import sys

from corpus_cases import CORPUS

import dsconfig


def run(*args):
    return subprocess.run([sys.executable, "-m", "dsconfig", *args], capture_output=True, text=True, timeout=60)


def test_check_a_corpus_file():
    result = run("check", str(CORPUS / "huggingface__transformers__tests__deepspeed__ds_config_zero3.json"),
                 "--world-size", "8")
    assert result.returncode == 0, result.stderr
    assert "batch: train_batch_size=auto" in result.stdout
    assert "ZeRO stage 3" in result.stdout and "optimizer offload to cpu" in result.stdout
    assert "stage3_gather_fp16_weights_on_model_save" in result.stderr  # the rename warning


def test_check_a_resolved_config_prints_the_triple(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"train_batch_size": 32, "gradient_accumulation_steps": 2}))
    result = run("check", str(path), "--world-size", "4")
    assert result.returncode == 0
    assert "train_batch_size=32, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2" in result.stdout


def test_check_a_broken_config_lists_every_error(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text(json.dumps({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                                "fp16": {"enabled": True}, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 5}}))
    result = run("check", str(path), "--world-size", "2")
    assert result.returncode == 1
    assert "INVALID" in result.stderr and "zero_optimization.stage = 5: must be one of 0, 1, 2, 3" in result.stderr
    assert "train_batch_size = 30: is not divisible" in result.stderr  # reported beside the type error


def test_check_strict_turns_unknown_keys_into_errors(tmp_path):
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"zero_optimisation": {"stage": 1}}))
    assert run("check", str(path)).returncode == 0
    strict = run("check", str(path), "--strict")
    assert strict.returncode == 1 and "did you mean 'zero_optimization'" in strict.stderr


def test_check_json_output_loads_back(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2}))
    result = run("check", str(path), "--json", "--world-size", "2")
    assert dsconfig.load(json.loads(result.stdout), world_size=2) == dsconfig.load(path, world_size=2)


def test_schema_describes_every_section():
    result = run("schema")
    schema = json.loads(result.stdout)
    for key in ("zero_optimization", "fp16", "bf16", "aio", "expert_parallel", "data_efficiency", "comms_logger"):
        assert key in schema["properties"]
    zero = schema["$defs"]["ZeroConfig"]["properties"]
    assert zero["stage"]["enum"] == [0, 1, 2, 3] and zero["stage"]["default"] == 0
    assert schema["properties"]["bfloat16"]["deprecated"] is True


def test_defaults_is_the_default_config():
    result = run("defaults")
    assert dsconfig.load(json.loads(result.stdout)) == dsconfig.DeepSpeedConfig()
