"""A script written for DeepSpeed runs unchanged but for `import dstrain as deepspeed`."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "deepspeed_style_train.py"
CONFIG = {
    "train_batch_size": 32, "gradient_accumulation_steps": 2, "steps_per_print": 2,
    "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 4}},
    "zero_optimization": {"stage": 2, "overlap_comm": True},
    "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": True},
    "gradient_clipping": 1.0,
}


def test_deepspeed_script_runs_after_the_import_change(tmp_path):
    source = SCRIPT.read_text()
    assert "\nimport deepspeed\n" in source
    script = tmp_path / "train.py"
    script.write_text(source.replace("\nimport deepspeed\n", "\nimport dstrain as deepspeed\n"))
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(CONFIG))
    # --standalone: the rendezvous on a free port, so copies of the suite can run at once.
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--standalone", str(script), "--deepspeed", "--deepspeed_config", str(config),
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world"] == 2 and result["stage"] == 2 and result["client"] == {"epoch": 1}
    assert result["steps"] == 256 // 32  # 128 samples per rank in micro-batches of 8, accumulated 2 at a time
    assert result["lr"] == [0.01]  # warmed up after 4 steps
    assert "step=2, skipped=0" in run.stderr
