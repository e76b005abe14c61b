"""The README's feature examples that have no test of their own, briefly, through the launcher at 2 processes.

The 2-stage pipeline (train_gpt_pipeline.py), AutoTP (train_llama_autotp.py), Ulysses sequence parallelism
(train_llama_ulysses.py) and the GPT at ZeRO-3 with NVMe offload (train_gpt.py, zero3_nvme_offload.json) run
side by side in one test (each launch spends most of its time importing; together they overlap): each rank
builds and trains its own stage, tensor shard or slice of the sequence, or swaps its partition to NVMe files, and
the checkpoints are laid out per stage, per tensor rank and per ZeRO rank.
"""

import csv
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY = ["--corpus-mb", "0.2", "--seq", "32", "--layers", "2", "--steps", "4"]
TIMEOUT = 300  # a loaded machine; a hang fails instead of blocking the suite


def start(cwd: Path, script: str, config: str, *args: str) -> subprocess.Popen:
    cwd.mkdir()
    command = [sys.executable, "-m", "dstrain.launcher", "--num_procs", "2",  # a free port of its own
               str(EXAMPLES / script), "--deepspeed_config", str(EXAMPLES / "configs" / config), *TINY, *args]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(launch: subprocess.Popen) -> tuple[str, str]:
    try:
        out, err = launch.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        launch.kill()  # the launcher's ranks die with it
        out, err = launch.communicate()
        pytest.fail(f"{launch.args[4]} did not finish in {TIMEOUT} s:\n{err[-3000:]}")
    assert launch.returncode == 0, err[-3000:]
    return out, err


def test_pipeline_autotp_ulysses_and_nvme_offload_examples_train_and_save_per_rank(tmp_path):
    pipeline = start(tmp_path / "pipe", "train_gpt_pipeline.py", "pipeline_2stage.json", "--d-model", "32")
    autotp = start(tmp_path / "autotp", "train_llama_autotp.py", "autotp2.json", "--hidden", "32")
    ulysses = start(tmp_path / "ulysses", "train_llama_ulysses.py", "ulysses_sp2.json", "--hidden", "32")
    nvme = start(tmp_path / "nvme", "train_gpt.py", "zero3_nvme_offload.json", "--d-model", "32")

    out, err = finish(pipeline)
    assert "pipeline stage 0 of 2, layers 0..1 of 4" in out  # by parameters: embeddings + one block
    assert "pipeline stage 1 of 2, layers 2..3 of 4" in out
    assert "schedule 1f1b, 4 micro-batches of 8 x 1 data-parallel replica(s)" in err
    assert "trained steps 0..4" in out and "validation loss" in out
    runs = tmp_path / "pipe" / "runs" / "train_gpt_pipeline"
    step = runs / "checkpoints" / "pipeline_2stage" / "global_step4"
    assert sorted(p.name for p in step.glob("layer_*")) == [f"layer_{i:02d}-model_states.safetensors"
                                                             for i in range(4)]
    assert (step / "pipe_00_of_02").is_dir() and (step / "pipe_01_of_02").is_dir()
    logged = runs / "logs" / "pipeline_2stage" / "Train_Samples_train_loss.csv"
    losses = [float(row[-1]) for row in list(csv.reader(logged.open()))[1:]]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    assert abs(losses[0] - math.log(256)) < 0.5  # small initial logits: the first loss is near ln(256)

    out, err = finish(autotp)
    for rank in (0, 1):
        line = next(line for line in out.splitlines() if line.startswith(f"rank {rank}: "))
        assert f"tensor-parallel rank {rank} of 2" in line and "1 data-parallel replica(s)" in line
        held, whole = (int(n.replace(",", "")) for n in re.search(r"holds ([\d,]+) of the model's ([\d,]+) ",
                                                                   line).groups())
        assert held < 0.75 * whole  # the projections are cut in two; embeddings, head and norms stay whole
    assert "AutoTP: 2 tensor ranks" in err and "AutoTP size 2" in err
    assert "trained steps 0..4" in out and "validation loss" in out
    step = tmp_path / "autotp" / "runs" / "train_llama_autotp" / "checkpoints" / "autotp2" / "global_step4"
    assert (step / "tp_00_of_02").is_dir() and (step / "tp_01_of_02").is_dir()

    out, err = finish(ulysses)
    assert "rank 0: sequence-parallel rank 0 of 2, characters 0..15 of each 32-character window" in out
    assert "rank 1: sequence-parallel rank 1 of 2, characters 16..31 of each 32-character window" in out
    assert "1 data-parallel replica(s)" in out and "sequence parallel size 2" in err
    assert "batch 4 = micro 4 x accumulation 1 x ranks 1" in err  # the batch counts data replicas only
    assert "trained steps 0..4" in out and "validation loss" in out
    runs = tmp_path / "ulysses" / "runs" / "train_llama_ulysses"
    step = runs / "checkpoints" / "ulysses_sp2" / "global_step4" / "zero"
    assert sorted(p.name for p in step.glob("zero_shard_*")) == [f"zero_shard_{i:05d}-of-00002.safetensors"
                                                                  for i in range(2)]  # ZeRO over sequence x data
    logged = runs / "logs" / "ulysses_sp2" / "Train_Samples_train_loss.csv"
    losses = [float(row[-1]) for row in list(csv.reader(logged.open()))[1:]]
    assert len(losses) == 4 and abs(losses[0] - math.log(256)) < 0.5  # the whole window's mean, from the start

    out, err = finish(nvme)
    sys.path.insert(0, str(EXAMPLES))
    from gpt_model import GPT

    whole = sum(p.numel() for p in GPT(seq=32, d_model=32, layers=2, heads=4).parameters())
    assert f"model: {whole / 1e6:.2f}M parameters" in out  # counted before ZeRO-3 partitions them
    assert "trained steps 0..4" in out and "validation loss" in out
    assert "ZeRO stage 3, optimizer offload to nvme, parameter offload to nvme" in err
    assert (tmp_path / "nvme" / "runs" / "train_gpt" / "nvme").is_dir()  # the config's nvme_path, under the run
    step = tmp_path / "nvme" / "runs" / "train_gpt" / "checkpoints" / "zero3_nvme_offload" / "global_step4"
    assert (step / "zero").is_dir()
