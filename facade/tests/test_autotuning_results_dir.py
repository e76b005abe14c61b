"""An autotuning results (or experiments) folder that cannot be created or written is a ConfigError naming
the key, before any experiment runs; it used to end `dstrain --autotuning tune` in a traceback."""

import json
from pathlib import Path

import pytest
from test_autotuning_e2e import TARGET, launch

import dsconfig
from dstrain.autotuning.experiments import prepare_dir


def test_an_unwritable_results_dir_is_refused_naming_the_key(tmp_path):
    (tmp_path / "blocker").write_text("a file where a folder of the path should be")
    config = {"train_micro_batch_size_per_gpu": [1, 2], "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0},
              "autotuning": {"enabled": True, "results_dir": "blocker/results", "exps_dir": "exps"}}
    (tmp_path / "tune.json").write_text(json.dumps(config))
    done = launch(tmp_path, "--num_procs", "1", "--autotuning", "tune", str(TARGET), "--deepspeed_config", "tune.json")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "autotuning.results_dir = 'blocker/results': cannot be created or written (Not a directory)" in done.stderr


@pytest.mark.parametrize("where", ["/proc/dstrain-autotuning-results", "/sys/kernel"])
def test_a_folder_that_cannot_be_made_or_written_names_the_key(where):
    # Neither can be written by anyone, root included (procfs makes no folders; sysfs's files are the kernel's).
    with pytest.raises(dsconfig.ConfigError) as info:
        prepare_dir(Path(where), "exps_dir")
    assert info.value.paths == ["autotuning.exps_dir"], str(info.value)
