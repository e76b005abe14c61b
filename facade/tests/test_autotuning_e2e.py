"""`dstrain --autotuning` end to end: real experiments through the launcher (gloo ranks on the CPU).

The example GPT is tuned at 2 ranks over a small space (2 stages x 2 micro-batches, 2 profiled steps),
the files DeepSpeed's autotuner writes are checked, and `--autotuning run` then trains with the chosen
config, reusing the measured experiments (autotuning.overwrite false). A script that crashes, runs out
of memory or hangs at chosen micro-batches has those experiments recorded and skipped.
"""

import csv
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from engine_models import ADAMW, TokenDataset, make_model
from test_launcher import MARKER, tagged_processes

import dstrain
from dscomm.testing import run_ranks

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[0] / "examples"
TARGET = HERE / "scripts" / "autotuning_target.py"
TIMEOUT = 400  # whole sessions on a loaded machine; a hang fails instead of blocking the suite


def launch(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    tag = uuid.uuid4().hex
    env = {**os.environ, MARKER: tag, "PYTHONUNBUFFERED": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, "-m", "dstrain.launcher", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert not tagged_processes(tag), "an experiment left processes behind"
    return done


def test_example_gpt_is_tuned_at_two_ranks_then_trained_with_the_chosen_config(tmp_path):
    config = json.loads((EXAMPLES / "configs" / "autotune.json").read_text())  # the README's, on a smaller space
    config.update(train_micro_batch_size_per_gpu=[2, 4], zero_optimization={"stage": [0, 1]})
    config["autotuning"].update(start_profile_step=2, end_profile_step=3, metric="latency")
    (tmp_path / "tune.json").write_text(json.dumps(config))
    script = [str(EXAMPLES / "train_gpt.py"), "--deepspeed_config", "tune.json", "--corpus-mb", "0.3", "--seq", "64",
              "--steps", "6"]  # experiments end after end_profile_step; the final run trains all 6

    tuned = launch(tmp_path, "--num_procs", "2", "--autotuning", "tune", *script)
    assert tuned.returncode == 0, tuned.stderr[-4000:]
    names = {"z0_gas1_tmbspg2", "z0_gas1_tmbspg4", "z1_gas1_tmbspg2", "z1_gas1_tmbspg4"}
    exps, results = tmp_path / "autotuning_exps", tmp_path / "autotuning_results"
    assert {p.stem for p in exps.glob("*.json")} == names
    for name in names:
        described = json.loads((exps / f"{name}.json").read_text())
        assert described["world_size"] == 2 and described["ds_config"]["zero_optimization"]["stage"] == int(name[1])
        assert {"ds_config.json", "cmd.txt", "exp.json", "metrics.json", "stdout.log", "stderr.log"} <= \
            {p.name for p in (results / name).iterdir()}
        metrics = json.loads((results / name / "metrics.json").read_text())
        assert metrics["latency"] > 0 and metrics["throughput"] > 0 and metrics["profile_steps"] == [2, 3]
    rows = list(csv.DictReader((results / "summary.csv").open()))
    assert {r["name"] for r in rows} == names and {r["status"] for r in rows} == {"ok"}
    best = min(rows, key=lambda r: float(r["latency_ms"]))  # latency: lowest is best
    summary = (results / "summary.txt").read_text()
    assert "| global       |               4 |" in summary and best["name"] in summary.splitlines()[6]
    assert summary in tuned.stdout + "\n"
    assert tuned.stderr.count("dstrain autotuning: [") == 4 and "left" in tuned.stderr
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert "autotuning" not in optimal and optimal["tensorboard"]["enabled"] is True
    assert optimal["zero_optimization"]["stage"] == int(best["stage"])
    assert optimal["train_micro_batch_size_per_gpu"] == int(best["micro_batch"])
    assert "ds_config_optimal.json" in (results / "cmd_optimal.txt").read_text()

    trained = launch(tmp_path, "--num_procs", "2", "--autotuning", "run", *script)
    assert trained.returncode == 0, trained.stderr[-4000:]
    assert trained.stderr.count("[earlier result]") == 4  # overwrite false, same config and command: not run again
    micro = optimal["train_micro_batch_size_per_gpu"]
    assert f"batch {2 * micro} = micro {micro} x accumulation 1 x ranks 2" in trained.stderr
    assert "trained steps 0..6" in trained.stdout
    assert (tmp_path / "runs" / "train_gpt" / "checkpoints" / "ds_config_optimal" / "global_step6").is_dir()


def test_crashing_out_of_memory_and_hanging_experiments_are_recorded_and_skipped(tmp_path):
    config = {"train_micro_batch_size_per_gpu": [1, 2, 3, 4], "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0},
              "autotuning": {"enabled": True, "start_profile_step": 2, "end_profile_step": 3,
                             "tuner_type": "gridsearch", "results_dir": "out/results", "exps_dir": "out/exps"}}
    (tmp_path / "tune.json").write_text(json.dumps(config))
    done = launch(tmp_path, "--num_procs", "1", "--stop_grace", "2", "--autotuning", "tune",
                   "--autotuning_timeout", "25", str(TARGET), "--deepspeed_config", "tune.json",
                   "--crash-at", "2", "--oom-at", "3", "--hang-at", "4")
    assert done.returncode == 0, done.stderr[-4000:]
    results = tmp_path / "out" / "results"
    status = {r["name"]: (r["status"], r["reason"]) for r in csv.DictReader((results / "summary.csv").open())}
    assert status["z0_gas1_tmbspg1"] == ("ok", "")
    assert status["z0_gas1_tmbspg2"] == ("crash", "RuntimeError: deliberate crash at micro-batch 2")
    assert status["z0_gas1_tmbspg3"][0] == "oom" and "allocate" in status["z0_gas1_tmbspg3"][1]
    assert status["z0_gas1_tmbspg4"][0] == "timeout"
    assert json.loads((results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 1
    assert "crash (RuntimeError: deliberate crash at micro-batch 2), skipped" in done.stderr
    assert (tmp_path / "out" / "exps" / "z0_gas1_tmbspg4.json").is_file()


def _train_steps(rank, world, config, steps):
    engine, *_ = dstrain.initialize(model=make_model(), config=config)
    data = TokenDataset(size=4 * steps).data
    for i in range(steps):
        engine.backward(engine(data[4 * i:4 * (i + 1)]))
        engine.step()
    return engine.global_steps


def test_autotuning_enabled_in_a_config_trains_as_configured(monkeypatch):
    monkeypatch.delenv("DSTRAIN_AUTOTUNING_METRICS", raising=False)
    config = {"train_micro_batch_size_per_gpu": 4, "optimizer": ADAMW,
              "autotuning": {"enabled": True, "start_profile_step": 1, "end_profile_step": 2}}
    assert run_ranks(_train_steps, 2, config, 4) == [4, 4]  # past end_profile_step: no experiment ends it
