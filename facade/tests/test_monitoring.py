"""Monitor events at the documented names and x-axis, read back from CSV and TensorBoard files."""

import csv
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine_models import ADAMW, TokenDataset, config, make_model

import dstrain
from dscomm.testing import run_ranks


def short_run(rank, world, directory):
    cfg = config(micro=4, gas=2, optimizer=ADAMW, wall_clock_breakdown=True, steps_per_print=2,
                 csv_monitor={"enabled": True, "output_path": directory, "job_name": "job"},
                 tensorboard={"enabled": True, "output_path": directory, "job_name": "tb"})
    engine, _, loader, _ = dstrain.initialize(model=make_model(), training_data=TokenDataset(size=64), config=cfg)
    losses = []
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.destroy()
    return losses, engine.global_steps


def test_csv_and_tensorboard_hold_the_loss_lr_and_timers_by_sample(tmp_path):
    (losses, steps), _ = run_ranks(short_run, 2, str(tmp_path))
    assert steps == 4
    root = tmp_path / "job"
    files = {p.name for p in root.rglob("*.csv")}
    assert {"Train_Samples_train_loss.csv", "Train_Samples_lr.csv", "Train_Samples_elapsed_time_ms_forward.csv",
            "Train_Samples_elapsed_time_ms_step.csv"} <= files
    rows = list(csv.reader(next(root.rglob("Train_Samples_train_loss.csv")).read_text().splitlines()))[1:]
    assert [int(float(r[0])) for r in rows] == [16, 32, 48, 64]  # x-axis: global samples (2 ranks x 4 x 2)
    assert abs(float(rows[0][1]) - (losses[0] + losses[1]) / 2) < 1e-5  # rank 0's mean over the accumulation
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(next(Path(tmp_path / "tb").rglob("events.out.tfevents.*")).parent))
    acc.Reload()
    assert [e.step for e in acc.Scalars("Train/Samples/lr")] == [16, 32, 48, 64]


def profiled_run(rank, world, directory):
    import gc

    import dscomm

    cfg = config(optimizer=ADAMW, flops_profiler={"enabled": True, "profile_step": 2,
                                                  "output_file": f"{directory}/flops.txt"},
                 comms_logger={"enabled": True}, disable_python_gc=True, dump_state=True)
    engine, *_ = dstrain.initialize(model=make_model(), config=cfg)
    gc_was_disabled = not gc.isenabled()
    data = TokenDataset().data
    for i in range(3):
        engine.backward(engine(data[i * 4:(i + 1) * 4]))
        engine.step()
    log = dscomm.get_comms_log()
    engine.destroy()
    return gc_was_disabled, gc.isenabled(), sorted(log)


def test_flops_profile_comms_log_and_gc_switch(tmp_path, capfd):
    gc_off, gc_back, ops = run_ranks(profiled_run, 2, str(tmp_path))[0]
    assert gc_off and gc_back
    assert "zero_allreduce_grads" in ops  # stage 0 reduces gradients with all_reduce, logged by name
    profile = (tmp_path / "flops.txt").read_text()
    assert "Profile Summary at step 2" in profile and "fwd flops per device" in profile
    assert '"steps_per_print"' in capfd.readouterr().err  # dump_state printed the resolved config


# ---------------------------------------------------------------------------------------------------------------
# Issue 28, item 9: the usual script shape, `def main(): engine, *_ = deepspeed.initialize(...); <train>` then
# `main()`, never calls destroy(): the engine (and its monitors) are freed when main() returns. A short run used
# to write no CSV at all and an empty TensorBoard file. A real process each, read back from the real files.

SCRIPT = """
import os, sys, time
import torch
sys.path.insert(0, {tests!r})
from engine_models import ADAMW, TokenDataset, config, make_model
import dstrain

def main():
    cfg = config(micro=4, optimizer=ADAMW, steps_per_print=1000,
                 csv_monitor={{"enabled": True, "output_path": "out", "job_name": "csv"}},
                 tensorboard={{"enabled": True, "output_path": "out", "job_name": "tb"}})
    engine, *_ = dstrain.initialize(model=make_model(), config=cfg)
    data = TokenDataset(size=4 * {steps}).data
    for i in range({steps}):
        engine.backward(engine(data[4 * i:4 * (i + 1)]))
        engine.step()
    {then}

main()
"""
STEPS = 6


def _run_script(folder: Path, then: str) -> subprocess.Popen:
    (folder / "train.py").write_text(SCRIPT.format(tests=str(Path(__file__).parent), steps=STEPS, then=then))
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    return subprocess.Popen([sys.executable, "train.py"], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_every_step_written(folder: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    samples = [4 * (i + 1) for i in range(STEPS)]
    for name in ("Train_Samples_train_loss.csv", "Train_Samples_lr.csv"):
        rows = list(csv.reader((folder / "out" / "csv" / name).read_text().splitlines()))
        assert [int(r[0]) for r in rows[1:]] == samples, name
    acc = EventAccumulator(str(folder / "out" / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("Train/Samples/train_loss")] == samples
    assert [e.step for e in acc.Scalars("Train/Samples/lr")] == samples


def test_a_script_that_never_calls_destroy_still_has_every_event_written(tmp_path):
    proc = _run_script(tmp_path, "pass  # no engine.destroy(): the engine is dropped when main() returns")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    _assert_every_step_written(tmp_path)


def test_a_rank_stopped_by_sigterm_has_every_event_written(tmp_path):
    proc = _run_script(tmp_path, "open('trained', 'w').close(); time.sleep(300)  # what torchrun's SIGTERM ends")
    deadline = time.monotonic() + 300
    while not (tmp_path / "trained").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM
    _assert_every_step_written(tmp_path)


def samples_per_second(rank, world):
    cfg = config(micro=4, gas=2, optimizer=ADAMW, steps_per_print=2, wall_clock_breakdown=True)
    engine, _, loader, _ = dstrain.initialize(model=make_model(), training_data=TokenDataset(size=96), config=cfg)
    for batch in loader:
        engine.backward(engine(batch))
        engine.step()
    timer = engine.tput_timer
    return timer.batch_size, timer.micro_step_count, timer.global_step_count, timer.avg_samples_per_sec()


def test_the_engine_times_samples_per_second_after_two_warm_up_steps():
    for batch, micro_steps, steps, rate in run_ranks(samples_per_second, 2):
        assert (batch, micro_steps, steps) == (16, 12, 6)  # 2 ranks x 4 x 2 a step; 96 samples on each rank
        assert rate > 0  # the steps after the second were timed
