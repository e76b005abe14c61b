"""The main job (facade/examples/train_gpt.py) through the launcher at 2 processes, resumed from its checkpoint."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def launch(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "dstrain.launcher", "--num_procs", "2",  # a free port of its own
               str(EXAMPLES / "train_gpt.py"), "--deepspeed_config", str(EXAMPLES / "configs" / "zero2.json"),
               "--corpus-mb", "0.3", "--seq", "64", "--save-every", "3", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_main_job_trains_logs_checkpoints_and_resumes(tmp_path):
    first = launch(tmp_path, "--steps", "6")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "trained steps 0..6" in first.stdout and "first loss" in first.stdout
    checkpoints = tmp_path / "runs" / "train_gpt" / "checkpoints" / "zero2"
    assert (checkpoints / "latest").read_text() == "global_step6"
    assert (checkpoints / "global_step3").is_dir()
    logs = tmp_path / "runs" / "train_gpt" / "logs"
    assert list(logs.rglob("events.out.tfevents.*")) and list(logs.rglob("Train_Samples_train_loss.csv"))

    resumed = launch(tmp_path, "--steps", "9", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "loaded checkpoint" in resumed.stderr and "trained steps 6..9" in resumed.stdout
    assert (checkpoints / "latest").read_text() == "global_step9"
