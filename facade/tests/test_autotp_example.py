"""The AutoTP example (facade/examples/train_llama_autotp.py) through the launcher at 2 processes: a Hugging
Face Llama built from a config is cut over 2 tensor ranks by `tensor_parallel.autotp_size: 2` alone, trains,
and saves one folder per tensor rank."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_llama_autotp_example_cuts_the_model_over_two_tensor_ranks_and_trains(tmp_path):
    command = [sys.executable, "-m", "dstrain.launcher", "--num_procs", "2",  # a free port of its own
               str(EXAMPLES / "train_llama_autotp.py"), "--deepspeed_config",
               str(EXAMPLES / "configs" / "autotp2.json"), "--corpus-mb", "0.2", "--seq", "32",
               "--hidden", "32", "--layers", "2", "--steps", "4"]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):
        line = next(line for line in run.stdout.splitlines() if line.startswith(f"rank {rank}: "))
        assert f"tensor-parallel rank {rank} of 2" in line and "1 data-parallel replica(s)" in line
        held, whole = (int(n.replace(",", "")) for n in re.search(r"holds ([\d,]+) of the model's ([\d,]+) ", line).groups())
        assert held < 0.75 * whole  # the projections are cut in two; embeddings, head and norms stay whole
    assert "AutoTP: 2 tensor ranks" in run.stderr and "AutoTP size 2" in run.stderr
    assert "trained steps 0..4" in run.stdout and "validation loss" in run.stdout
    step = tmp_path / "runs" / "train_llama_autotp" / "checkpoints" / "autotp2" / "global_step4"
    assert (step / "tp_00_of_02").is_dir() and (step / "tp_01_of_02").is_dir()
