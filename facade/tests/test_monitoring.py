"""Monitor events at the documented names and x-axis, read back from CSV and TensorBoard files."""

import csv
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
