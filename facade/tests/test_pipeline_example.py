"""The 2-stage pipeline example (facade/examples/train_gpt_pipeline.py) through the launcher at 2 processes:
each rank builds and trains its own stage, the losses are the schedule's, and the checkpoint holds one file
per layer, written by the stage that holds it."""

import csv
import math
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_gpt_pipeline_example_trains_two_stages_and_saves_each_layer(tmp_path):
    command = [sys.executable, "-m", "dstrain.launcher", "--num_procs", "2",  # a free port of its own
               str(EXAMPLES / "train_gpt_pipeline.py"), "--deepspeed_config",
               str(EXAMPLES / "configs" / "pipeline_2stage.json"), "--corpus-mb", "0.2", "--seq", "32",
               "--d-model", "32", "--layers", "2", "--steps", "4"]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "pipeline stage 0 of 2, layers 0..1 of 4" in run.stdout  # by parameters: embeddings + one block
    assert "pipeline stage 1 of 2, layers 2..3 of 4" in run.stdout
    assert "schedule 1f1b, 4 micro-batches of 8 x 1 data-parallel replica(s)" in run.stderr
    assert "trained steps 0..4" in run.stdout and "validation loss" in run.stdout

    step = tmp_path / "runs" / "train_gpt_pipeline" / "checkpoints" / "pipeline_2stage" / "global_step4"
    assert sorted(p.name for p in step.glob("layer_*")) == [f"layer_{i:02d}-model_states.safetensors"
                                                             for i in range(4)]
    assert (step / "pipe_00_of_02").is_dir() and (step / "pipe_01_of_02").is_dir()
    logged = tmp_path / "runs" / "train_gpt_pipeline" / "logs" / "pipeline_2stage" / "Train_Samples_train_loss.csv"
    losses = [float(row[-1]) for row in list(csv.reader(logged.open()))[1:]]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    assert abs(losses[0] - math.log(256)) < 0.5  # small initial logits: the first loss is near ln(256)
