"""MonitorMaster with every backend on, failing backends, the queue bound and input errors."""

import os
import shutil
import subprocess
import sys
import threading
import time

import dsmonitor_readers as readers
import pytest
import torch

import dsconfig
from dsmonitor import MonitorConfigError, MonitorError, MonitorMaster, events


def all_four(tmp_path):
    return dict(
        tensorboard=dsconfig.TensorBoardConfig(enabled=True, output_path=str(tmp_path / "tb"), job_name="job"),
        wandb=dsconfig.WandbConfig(enabled=True, project="proj"),
        comet=dsconfig.CometConfig(enabled=True, online=False, samples_log_interval=1),
        csv_monitor=dsconfig.CSVMonitorConfig(enabled=True, output_path=str(tmp_path / "csv"), job_name="job"),
    )


class Recorder:
    """A user backend (the Backend protocol) that keeps what it is given; `fail_on` batches raise."""

    def __init__(self, name="recorder", fail_on=(), gate=None):
        self.name, self.fail_on, self.gate = name, set(fail_on), gate
        self.batches, self.events, self.closed = 0, [], False

    def write_events(self, evts):
        if self.gate is not None:
            self.gate.wait()
        self.batches += 1
        if self.batches in self.fail_on:
            raise OSError(28, "No space left on device")
        self.events.extend(evts)

    def flush(self):
        pass

    def close(self):
        self.closed = True


def steps(n, start=0):
    return [[(events.TRAIN_LOSS, 1.0 / (s + 1), s), (events.LR, s * 1e-4, s)] for s in range(start, start + n)]


def test_all_four_backends_from_a_deepspeed_config(tmp_path):
    cfg = dsconfig.load({"train_batch_size": 8, **{k: {f.name: getattr(v, f.name) for f in v.__attrs_attrs__}
                                                  for k, v in all_four(tmp_path).items()}})
    written = [e for batch in steps(20) for e in batch]
    with MonitorMaster.from_config(cfg) as monitor:
        assert set(monitor.backends) == {"tensorboard", "wandb", "comet", "csv_monitor"}
        for batch in steps(20):
            monitor.write_events(batch)
    assert monitor.failures == {"tensorboard": 0, "wandb": 0, "comet": 0, "csv_monitor": 0}
    tb = readers.tensorboard_scalars(str(tmp_path / "tb" / "job"))
    assert {n: [s for s, _ in pts] for n, pts in tb.items()} == {
        events.TRAIN_LOSS: list(range(20)), events.LR: list(range(20))}
    history = readers.wandb_run(os.environ["WANDB_DIR"])["history"]
    assert [(r["_step"], r[events.TRAIN_LOSS], r[events.LR]) for r in history] == [
        (s, 1.0 / (s + 1), s * 1e-4) for s in range(20)]
    _, metrics = readers.comet_metrics(os.environ["COMET_OFFLINE_DIRECTORY"])
    assert [m for m in metrics if m[0].startswith("Train/")] == written
    rows = readers.csv_rows(str(tmp_path / "csv" / "job" / "Train_Samples_lr.csv"))
    assert [(int(s), float(v)) for s, v in rows[1:]] == [(s, s * 1e-4) for s in range(20)]


def test_a_backend_raising_mid_run_leaves_the_others_complete(tmp_path, caplog):
    cfg = all_four(tmp_path)
    failing = Recorder(fail_on={2, 3})
    with MonitorMaster(**cfg, extra_backends=[failing]) as monitor:
        for batch in steps(10):
            monitor.write_events(batch)
            monitor.flush()  # one batch per write, so batches 2 and 3 are the failing ones
        # The disk goes away under the CSV monitor: a new event name cannot open its file.
        shutil.rmtree(tmp_path / "csv")
        monitor.write_events([("Train/Samples/new", 1.0, 10)] + steps(1, start=10)[0])
    assert monitor.failures["recorder"] == 2 and monitor.failures["csv_monitor"] >= 1
    assert [s for _, _, s in failing.events] == [s for s in range(11) if s not in (1, 2) for _ in range(2)] + [10]
    assert sum("the recorder monitor failed" in r.getMessage() for r in caplog.records) == 1  # once
    tb = readers.tensorboard_scalars(str(tmp_path / "tb" / "job"))
    assert [s for s, _ in tb[events.LR]] == list(range(11)) and tb["Train/Samples/new"] == [(10, 1.0)]
    history = readers.wandb_run(os.environ["WANDB_DIR"])["history"]
    assert [r["_step"] for r in history] == list(range(11))
    _, metrics = readers.comet_metrics(os.environ["COMET_OFFLINE_DIRECTORY"])
    assert len([m for m in metrics if m[0].startswith("Train/")]) == 23


def test_a_stuck_backend_drops_its_own_events_and_does_not_block_the_caller(tmp_path):
    gate = threading.Event()
    stuck, healthy = Recorder("stuck", gate=gate), Recorder("healthy")
    with MonitorMaster(extra_backends=[stuck, healthy], max_pending=3) as monitor:
        for i, batch in enumerate(steps(10)):
            monitor.write_events(batch)  # returns although `stuck` never finishes a write
            deadline = time.monotonic() + 10
            while len(healthy.events) < 2 * (i + 1) and time.monotonic() < deadline:
                time.sleep(0.001)  # let the healthy thread keep up, so only `stuck` overflows
        assert monitor.flush(timeout=0.2) is False
        gate.set()
    assert len(healthy.events) == 20
    assert monitor.dropped_events["stuck"] > 0 and monitor.dropped_events["healthy"] == 0
    assert len(stuck.events) + monitor.dropped_events["stuck"] == 20
    assert stuck.closed and healthy.closed


def test_tensor_values_are_converted_off_the_callers_thread():
    rec = Recorder()
    loss = torch.tensor(3.5)
    with MonitorMaster(extra_backends=[rec]) as monitor:
        monitor.write_events([(events.TRAIN_LOSS, loss, 1), (events.LR, torch.tensor([0.25]), 1)])
        loss.add_(1.0)  # the event keeps the value it had when written
    assert rec.events == [(events.TRAIN_LOSS, 3.5, 1), (events.LR, 0.25, 1)]
    assert all(type(v) is float for _, v, _ in rec.events)


@pytest.mark.parametrize(("batch", "message"), [
    ([("a", 1.0)], r"\(name, value, step\) tuples"),
    ([(1, 1.0, 1)], "event name must be a str"),
    ([("a", "high", 1)], "event value must be a number"),
    ([("a", torch.ones(2), 1)], "one-element tensor"),
    ([("a", 1.0, 1.5)], "event step must be an integer"),
])
def test_malformed_events_raise_on_the_callers_thread(batch, message):
    with MonitorMaster(extra_backends=[Recorder()]) as monitor, pytest.raises(MonitorConfigError, match=message):
        monitor.write_events(batch)


def test_only_the_write_rank_writes(tmp_path):
    csv_cfg = dsconfig.CSVMonitorConfig(enabled=True, output_path=str(tmp_path), job_name="job")
    other = MonitorMaster(csv_monitor=csv_cfg, rank=1)
    assert not other.enabled and other.backends == {}
    other.write_events([(events.LR, 1.0, 1)])  # a no-op, not an error
    other.close()
    assert not (tmp_path / "job").exists()
    with MonitorMaster(csv_monitor=csv_cfg, rank=1, write_rank=None) as every:
        every.write_events([(events.LR, 1.0, 1)])
    assert os.listdir(tmp_path / "job" / "rank1") == ["Train_Samples_lr.csv"]


def test_write_after_close_is_an_error_and_close_is_idempotent():
    monitor = MonitorMaster(extra_backends=[Recorder()])
    monitor.close()
    monitor.close()
    with pytest.raises(MonitorError, match="after close"):
        monitor.write_events([(events.LR, 1.0, 1)])


def test_events_are_written_at_exit_without_close(tmp_path):
    code = ("import dsconfig, dsmonitor\n"
            "m = dsmonitor.MonitorMaster(csv_monitor=dsconfig.CSVMonitorConfig(enabled=True, job_name='j'),\n"
            "                            wandb=dsconfig.WandbConfig(enabled=True))\n"
            "m.write_events([('x', float(i), i) for i in range(1000)])\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, timeout=300)
    assert len(readers.csv_rows(str(tmp_path / "j" / "x.csv"))) == 1001
    history = readers.wandb_run(os.environ["WANDB_DIR"])["history"]
    assert [row["x"] for row in history] == [float(i) for i in range(1000)]
