"""The RLHF example (facade/examples/train_rlhf_actor.py) through the launcher on 2 processes: the actor
generates with the Hybrid Engine at ZeRO-3 between PPO steps, prints DeepSpeed's latency split, and the
split reaches the CSV monitor."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_rlhf_example_generates_and_trains_at_zero_3(tmp_path):
    command = [sys.executable, "-m", "dstrain.launcher", "--num_procs", "2", str(EXAMPLES / "train_rlhf_actor.py"),
               "--deepspeed_config", str(EXAMPLES / "configs" / "rlhf_actor_zero3.json"), "--iterations", "3"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "iteration   2  mean reward" in done.stdout and "mean reward: first iterations" in done.stdout
    assert "|E2E latency=" in done.stderr and "|Generate time=" in done.stderr and "|Gather latency=" in done.stderr
    logs = tmp_path / "runs" / "train_rlhf_actor" / "logs" / "zero3"
    assert (logs / "Train_HybridEngine_generate_s.csv").is_file()
