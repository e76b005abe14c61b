"""The README's Hugging Face Trainer example (facade/examples/train_hf_trainer.py), a plain Trainer script that
never names dstrain, started by the `deepspeed` command at 2 processes: the "auto" config is filled by the
Trainer and dstrain's engine trains at ZeRO stage 2."""

import ast
import math
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "facade" / "examples"


def test_the_trainer_example_trains_on_dstrains_engine_under_the_deepspeed_command(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DSTRAIN_")}, "HF_HOME": str(tmp_path / "hf")}
    run = subprocess.run([str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2",
                          str(EXAMPLES / "train_hf_trainer.py"), "--deepspeed",
                          str(EXAMPLES / "configs" / "hf_trainer_zero2.json"), "--steps", "4", "--corpus-mb", "0.2",
                          "--seq", "32", "--hidden", "32", "--layers", "2", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "trained 4 steps with dstrain.engine.deepspeed_engine.DeepSpeedEngine, ZeRO stage 2" in run.stdout
    logged = [ast.literal_eval(line) for line in run.stdout.splitlines() if line.startswith("{'loss'")]
    assert len(logged) == 4  # logging_steps 1 at 4 steps: the Trainer's own records of the engine's losses
    losses = [float(record["loss"]) for record in logged]
    assert all(math.isfinite(loss) for loss in losses) and abs(losses[0] - math.log(256)) < 0.5
    assert float(logged[1]["learning_rate"]) > 0  # the Trainer's warmup reached the engine's scheduler ("auto")
