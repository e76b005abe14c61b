"""The masked-LM example (facade/examples/train_bert_mlm.py): with --deepspeed_transformer_kernel and all
three memory flags it trains through the launcher and its loss falls; the tutorial's refusals hold."""

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_bert_mlm.py"
CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "bert_mlm.json"
SMALL = ["--hidden", "32", "--layers", "2", "--heads", "2", "--seq", "32", "--corpus-mb", "0.2"]


def test_the_kernel_with_all_memory_flags_trains_and_its_loss_falls(tmp_path):
    run = subprocess.run([sys.executable, "-m", "dstrain.launcher", "--num_procs", "1", str(EXAMPLE),
                          "--deepspeed_config", str(CONFIG), "--deepspeed_transformer_kernel", "--normalize_invertible",
                          "--attention_dropout_checkpoint", "--gelu_checkpoint", "--steps", "30", *SMALL],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2 x DeepSpeedTransformerLayer with normalize_invertible, attention_dropout_checkpoint, gelu_checkpoint" \
        in run.stdout
    summary = next(line for line in run.stdout.splitlines() if line.startswith("trained 30 steps"))
    first, last = (float(v) for v in summary.split("masked-LM loss ")[1].split(" (")[0].split(" -> "))
    assert last < first - 0.5, summary  # from ~5.6 (uniform over 257) towards the characters' statistics


def test_sparse_attention_beside_the_kernel_is_refused_with_the_tutorials_note(tmp_path):
    config = json.loads(CONFIG.read_text())
    config["sparse_attention"] = {"mode": "fixed", "block": 16}
    (tmp_path / "sparse.json").write_text(json.dumps(config))
    run = subprocess.run([sys.executable, str(EXAMPLE), "--deepspeed_config", str(tmp_path / "sparse.json"),
                          "--deepspeed_transformer_kernel", *SMALL], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert "sparse_attention: the DeepSpeed transformer kernel does not support sparse attention" in run.stderr


def test_memory_flags_need_the_kernel(tmp_path):
    run = subprocess.run([sys.executable, str(EXAMPLE), "--deepspeed_config", str(CONFIG), "--gelu_checkpoint"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--gelu_checkpoint configure the transformer kernel" in run.stderr
