"""The GPT+MoE example (facade/examples/train_gpt_moe.py) through the launcher on 2 processes: a PR-MoE
at ep_size 2 trains, reports its expert loads and saves; a Mixture-of-Students student at ep_size 1
distils from that checkpoint."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def launch(cwd: Path, config: str, *args: str) -> subprocess.CompletedProcess:
    # No --master_port: the launcher finds a free one (two copies of the suite may run at once).
    command = [sys.executable, "-m", "dstrain.launcher", "--num_procs", "2",
               str(EXAMPLES / "train_gpt_moe.py"), "--deepspeed_config", str(EXAMPLES / "configs" / config),
               "--corpus-mb", "0.2", "--seq", "32", "--d-model", "32", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_gpt_moe_example_trains_pr_moe_then_a_student_from_it(tmp_path):
    teacher = launch(tmp_path, "moe_ep2.json", "--ep-size", "2", "--num-experts", "2", "4",
                     "--mlp-type", "residual", "--steps", "4", "--report-expert-counts", "2")
    assert teacher.returncode == 0, teacher.stderr[-3000:]
    assert "expert-parallel size 2" in teacher.stdout and "trained steps 0..4" in teacher.stdout
    checkpoint = tmp_path / "runs" / "train_gpt_moe" / "checkpoints" / "moe_ep2" / "global_step4"
    assert (checkpoint / "layer_1_expert_3_mp_rank_00_model_states.safetensors").is_file()
    logs = tmp_path / "runs" / "train_gpt_moe" / "logs" / "moe_ep2"
    assert (logs / "Train_Samples_moe_layer_1_expert_3_tokens.csv").is_file()

    student = launch(tmp_path, "moe_ep1.json", "--ep-size", "1", "--num-experts", "2", "--mos",  # 2 per layer
                     "--load-teacher", str(checkpoint.parent), "--teacher-num-experts", "2", "4",
                     "--teacher-mlp-type", "residual", "--mos-stop-step", "2", "--steps", "3", "--out", "runs/mos")
    assert student.returncode == 0, student.stderr[-3000:]
    assert "trained steps 0..3" in student.stdout
