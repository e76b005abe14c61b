"""`dstp plan <model config.json>` prints every parameter's split; bad input fails with a named reason."""

import json

import tiny_models

from dstp.cli import main


def test_plan_prints_every_parameter_and_the_unmatched(tmp_path, capsys):
    tiny_models.config("phi3").to_json_file(tmp_path / "config.json")
    (tmp_path / "ds.json").write_text(json.dumps({"tensor_parallel": {"autotp_size": 2, "preset_model": "phi3"}}))
    assert main(["plan", str(tmp_path), "--ds-config", str(tmp_path / "ds.json")]) == 0
    out = capsys.readouterr().out
    assert "rules from preset phi3" in out and "model.layers.1.self_attn.qkv_proj.weight" in out
    assert "dim 0: 16+8+8 of 32+16+16" in out and "matched by no rule (kept whole): 7" in out


def test_plan_refusals_exit_1_naming_the_problem(tmp_path, capsys):
    tiny_models.config("llama").to_json_file(tmp_path / "config.json")
    assert main(["plan", str(tmp_path / "config.json"), "--tp", "4"]) == 1
    assert "num_key_value_heads" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{nope")
    assert main(["plan", str(tmp_path / "bad.json")]) == 1
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "missing.json")]) == 1
    assert "no such file" in capsys.readouterr().err
