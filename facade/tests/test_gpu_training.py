"""On a CUDA GPU: the example GPT trained by dstrain on one GPU (a world of one on NCCL) against the same
training on the CPU (gloo): float32 ZeRO-3 with prefetching gives the CPU run's losses, bf16 (ZeRO-2)
trains in bf16, fp16 (ZeRO-1) skips the steps its loss scale overflows and trains once the scale has come
down. Both runs are scripts/gpu_train_gpt.py, each in a process of its own (CUDA must not be forked). And the
example script itself, facade/examples/train_gpt.py, trains on the GPU as a user runs it.

With one rank there is nobody to gather from: the prefetch machinery runs (plans, asynchronous handles,
releases) on the GPU, but the gathers are copies; overlapping NCCL's stream needs two GPUs.
Skipped without CUDA; DSTRAIN_GPU_REHEARSAL=1 (tools/gpu_check/run.sh --dry-run) runs the CPU side and
holds it to the same assertions.
"""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
REHEARSAL = os.environ.get("DSTRAIN_GPU_REHEARSAL") == "1"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (CUDA or REHEARSAL), reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                    "tools/gpu_check/run.sh --dry-run rehearses it on the CPU")]

SCRIPT = Path(__file__).parent / "scripts" / "gpu_train_gpt.py"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
_RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def train(on_cpu: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS}  # a world of one, whatever launched us
    if on_cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> dict:
    cpu = train(on_cpu=True)
    return {"cpu": cpu, "gpu": train(on_cpu=False) if CUDA else cpu}


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def test_one_rank_zero3_with_prefetch_on_the_gpu_gives_the_cpu_losses(runs):
    gpu, cpu = runs["gpu"], runs["cpu"]
    assert cpu["device"] == "cpu" and cpu["backend"] == "gloo"
    if CUDA:
        assert gpu["device"] == "cuda" and gpu["backend"] == "nccl"
    got, want = gpu["zero3_fp32"], cpu["zero3_fp32"]
    assert got["param_devices"] == [gpu["device"]] and got["param_dtypes"] == ["torch.float32"]
    assert got["prefetched"] > 0, "no unit was gathered ahead of its use"
    assert all(got["applied"])
    assert relative(got["loss"][0], want["loss"][0]) < 1e-5, (got["loss"], want["loss"])
    # later steps: float32 sums in another order, through AdamW's normalisation, for a few steps
    worst = max(relative(g, w) for g, w in zip(got["loss"], want["loss"]))
    assert worst < 1e-3, (got["loss"], want["loss"])
    assert got["loss"][-1] < got["loss"][0]


def test_activation_checkpointing_to_host_memory_changes_no_loss_on_the_gpu(runs):
    got = runs["gpu"]["zero3_fp32_checkpointed"]
    plain = runs["gpu"]["zero3_fp32"]
    assert got["param_devices"] == [runs["gpu"]["device"]]
    # recomputation repeats the forward exactly; 1e-4 leaves room for a GPU kernel that sums in another order
    assert max(relative(g, w) for g, w in zip(got["loss"], plain["loss"])) < 1e-4, (got["loss"], plain["loss"])


def test_bf16_training_on_the_gpu(runs):
    gpu, cpu = runs["gpu"], runs["cpu"]
    got = gpu["bf16_zero2"]
    assert got["param_devices"] == [gpu["device"]] and got["param_dtypes"] == ["torch.bfloat16"]
    assert all(got["applied"]) and got["skipped_steps"] == 0
    assert relative(got["loss"][0], cpu["zero3_fp32"]["loss"][0]) < 2e-2  # bf16 forward against float32
    assert relative(got["loss"][0], cpu["bf16_zero2"]["loss"][0]) < 2e-2
    assert got["loss"][-1] < got["loss"][0] - 0.1, got["loss"]


def test_fp16_training_on_the_gpu_skips_overflowing_steps_then_trains(runs):
    gpu, cpu = runs["gpu"], runs["cpu"]
    got = gpu["fp16_zero1"]
    assert got["param_devices"] == [gpu["device"]] and got["param_dtypes"] == ["torch.float16"]
    applied, scale = got["applied"], got["scale"]
    assert not applied[0] and scale[0] == 2.0**25, "the first step's overflow must skip it and halve the scale"
    assert got["skipped_steps"] == applied.count(False) >= 1
    assert all(applied[-5:]), f"steps still skipped at the end: {applied}"
    assert all(later <= earlier for earlier, later in itertools.pairwise(scale))  # no growth within 1000 steps
    first_applied = applied.index(True)
    assert relative(got["loss"][0], cpu["fp16_zero1"]["loss"][0]) < 1e-2
    assert got["loss"][-1] < got["loss"][first_applied] - 0.1, got["loss"]


def test_the_example_script_trains_on_the_gpu(tmp_path):
    """facade/examples/train_gpt.py as a user runs it (ZeRO-3 config, world of one): its batches must reach the
    device the engine trains on; then it evaluates, saves a checkpoint and resumes from it."""
    if not CUDA:  # 20 s of CPU for what test_main_job.py and test_autotuning_e2e.py already run on the CPU
        pytest.skip("the example's CPU runs are test_main_job.py's; this one is for the GPU")
    config = json.loads((EXAMPLES / "configs" / "zero3.json").read_text())
    config.pop("tensorboard")  # the monitors' extras are not this test's concern: CSV needs none
    config["csv_monitor"]["output_path"] = str(tmp_path / "logs")
    (tmp_path / "zero3.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS}
    steps = 30 if CUDA else 6

    def train(*extra: str) -> str:
        run = subprocess.run([sys.executable, str(EXAMPLES / "train_gpt.py"), "--deepspeed_config", "zero3.json",
                              "--corpus-mb", "0.3", "--seq", "64", "--out", str(tmp_path / "out"), *extra],
                             capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
        return run.stdout

    first = train("--steps", str(steps), "--save-every", str(steps))
    assert f"trained steps 0..{steps}" in first and "validation loss" in first
    assert (tmp_path / "out" / "checkpoints" / "zero3" / "latest").exists()
    # and it resumes from that checkpoint on the same device (the files hold CPU tensors)
    assert f"trained steps {steps}..{steps + 2}" in train("--resume", "--steps", str(steps + 2))
