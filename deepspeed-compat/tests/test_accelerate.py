"""Accelerate on dstrain: a script with a DeepSpeedPlugin, started by `accelerate launch --use_deepspeed`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "accelerate_train.py"


def test_an_accelerate_script_with_a_deepspeed_plugin_trains_under_accelerate_launch(tmp_path):
    launcher = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    assert launcher is not None, "accelerate's command is not installed beside this Python"
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([launcher, "launch", "--use_deepspeed", "--num_processes", "2", "--num_machines", "1",
                          "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
                          str(SCRIPT)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("REPORT "))
    report = json.loads(line[len("REPORT "):])
    for stage in ("2", "3"):
        assert report[stage]["engine"] == "dstrain.engine.deepspeed_engine.DeepSpeedEngine"
        assert len(report[stage]["losses"]) == 8 and report[stage]["state_keys"] == 21
    # ZeRO-3 partitions what ZeRO-2 keeps whole: the same training either way, and the engine's own loop's.
    assert report["3"]["losses"] == pytest.approx(report["2"]["losses"], rel=1e-6)
    assert report["3"]["losses"] == pytest.approx(report["direct"], rel=1e-6)
