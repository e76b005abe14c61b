"""DeepSpeed's pipeline tutorial runs unchanged but for `import dstrain as deepspeed`, under torchrun."""

import json
import socket
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_tutorial_train.py"
CONFIG = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 3,
          "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 1},
          "pipeline": {"schedule": "zb_h1"}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_pipeline_tutorial_trains_after_the_import_change(tmp_path):
    source = SCRIPT.read_text()
    assert "\nimport deepspeed\n" in source
    script = tmp_path / "train.py"
    script.write_text(source.replace("\nimport deepspeed\n", "\nimport dstrain as deepspeed\n"))
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(CONFIG))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(free_port()), str(script), "--deepspeed", "--deepspeed_config",
                          str(config), "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["steps"] == 7 and result["stage"] == 0 and result["first"] and result["schedule"] == "zb_h1"
    assert result["losses"][-2] < result["losses"][0]  # it learns
    assert result["partitions"] == [0, 6, 7]  # by parameters, DeepSpeed's rule: the last Linear alone
    assert "steps: 3 loss:" in run.stderr
