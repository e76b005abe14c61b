"""Each backend alone, through MonitorMaster, read back with its own reader."""

import os

import dsmonitor_readers as readers
import pytest

import dsconfig
import dsmonitor
from dsmonitor import MonitorConfigError, MonitorMaster, events

EVENTS = [
    (events.TRAIN_LOSS, 2.5, 8),
    (events.LR, 1e-3, 8),
    (events.TRAIN_LOSS, 2.25, 16),
    (events.LR, 9e-4, 16),
    (events.TRAIN_LOSS, 2.0, 24),
    (events.LR, 8e-4, 24),
]


def by_name(evts):
    out = {}
    for name, value, step in evts:
        out.setdefault(name, []).append((step, value))
    return out


def test_tensorboard_holds_every_scalar_at_its_step(tmp_path):
    cfg = dsconfig.TensorBoardConfig(enabled=True, output_path=str(tmp_path / "out"), job_name="job")
    with MonitorMaster(tensorboard=cfg) as monitor:
        monitor.write_events(EVENTS[:2])
        monitor.write_events(EVENTS[2:])
    got = readers.tensorboard_scalars(str(tmp_path / "out" / "job"))
    want = by_name(EVENTS)
    assert set(got) == set(want)
    for name in want:
        assert [s for s, _ in got[name]] == [s for s, _ in want[name]]
        assert [v for _, v in got[name]] == pytest.approx([v for _, v in want[name]], rel=1e-6)  # float32


def test_tensorboard_default_path_is_the_launching_directory(tmp_path):
    with MonitorMaster(tensorboard=dsconfig.TensorBoardConfig(enabled=True)) as monitor:
        monitor.write_events([(events.LR, 0.5, 1)])
    assert readers.tensorboard_scalars(str(tmp_path / "DeepSpeedJobName")) == {events.LR: [(1, 0.5)]}


def test_wandb_offline_run_holds_the_history(tmp_path):
    cfg = dsconfig.WandbConfig(enabled=True, group="grp", team="my_team", project="proj")
    with MonitorMaster(wandb=cfg) as monitor:
        monitor.write_events(EVENTS[:3])
        monitor.write_events(EVENTS[3:])
    run = readers.wandb_run(os.environ["WANDB_DIR"])
    assert run["run"] == {"project": "proj", "entity": "my_team", "group": "grp"}
    rows = [{k: v for k, v in row.items() if not k.startswith("_")} | {"step": row["_step"]}
            for row in run["history"]]
    assert rows == [
        {events.TRAIN_LOSS: 2.5, events.LR: 1e-3, "step": 8},
        {events.TRAIN_LOSS: 2.25, events.LR: 9e-4, "step": 16},
        {events.TRAIN_LOSS: 2.0, events.LR: 8e-4, "step": 24},
    ]


def test_comet_offline_archive_holds_the_metrics(tmp_path):
    cfg = dsconfig.CometConfig(enabled=True, online=False, project="proj", workspace="ws",
                               experiment_name="run-a", samples_log_interval=1)
    with MonitorMaster(comet=cfg) as monitor:
        monitor.write_events(EVENTS)
    experiment, metrics = readers.comet_metrics(os.environ["COMET_OFFLINE_DIRECTORY"])
    assert experiment["project_name"] == "proj" and experiment["workspace"] == "ws"
    ours = [m for m in metrics if m[0].startswith("Train/")]
    assert ours == EVENTS


def test_comet_logs_each_name_once_per_samples_log_interval(tmp_path):
    cfg = dsconfig.CometConfig(enabled=True, online=False, samples_log_interval=16)
    with MonitorMaster(comet=cfg) as monitor:
        monitor.write_events([(events.LR, float(step), step) for step in range(0, 64, 8)])
    _, metrics = readers.comet_metrics(os.environ["COMET_OFFLINE_DIRECTORY"])
    assert [m for m in metrics if m[0] == events.LR] == [(events.LR, float(s), s) for s in (0, 16, 32, 48)]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"experiment_key": "short"}, "32 to 50 letters and digits"),
    ({"experiment_key": "x" * 31 + "-"}, "32 to 50 letters and digits"),
    ({"mode": "get"}, "needs comet.experiment_key"),
])
def test_comet_config_errors_say_what_is_valid(kwargs, message):
    with pytest.raises(MonitorConfigError, match=message):
        MonitorMaster(comet=dsconfig.CometConfig(enabled=True, online=False, **kwargs))


def test_csv_files_hold_exactly_the_events(tmp_path):
    cfg = dsconfig.CSVMonitorConfig(enabled=True, output_path=str(tmp_path / "out"), job_name="job")
    with MonitorMaster(csv_monitor=cfg) as monitor:
        monitor.write_events(EVENTS)
    job = tmp_path / "out" / "job"
    assert sorted(os.listdir(job)) == ["Train_Samples_lr.csv", "Train_Samples_train_loss.csv"]
    for name, points in by_name(EVENTS).items():
        rows = readers.csv_rows(str(job / (name.replace("/", "_") + ".csv")))
        assert rows[0] == ["step", "value"]
        assert [(int(s), float(v)) for s, v in rows[1:]] == points  # exact: floats written with repr


def test_csv_resume_appends_without_a_second_header(tmp_path):
    cfg = dsconfig.CSVMonitorConfig(enabled=True, output_path=str(tmp_path), job_name="job")
    with MonitorMaster(csv_monitor=cfg) as monitor:
        monitor.write_events([(events.LR, 0.1, 1)])
    with MonitorMaster(csv_monitor=cfg) as monitor:
        monitor.write_events([(events.LR, 0.2, 2)])
    assert readers.csv_rows(str(tmp_path / "job" / "Train_Samples_lr.csv")) == [
        ["step", "value"], ["1", "0.1"], ["2", "0.2"]]


def test_csv_names_that_would_share_a_file_are_reported(tmp_path):
    cfg = dsconfig.CSVMonitorConfig(enabled=True, output_path=str(tmp_path), job_name="job")
    with MonitorMaster(csv_monitor=cfg) as monitor:
        monitor.write_events([("a/b", 1.0, 1), ("a_b", 2.0, 1)])
        monitor.flush()
        assert monitor.failures == {"csv_monitor": 1}
        assert "would share the file" in str(monitor._workers[0].last_error)


def test_disabled_tensorboard_and_csv_monitors_create_nothing(tmp_path):
    # As DeepSpeed's: built from a disabled section, neither creates its folder, a writer or a file.
    tmp_path = tmp_path / "monitors"
    tmp_path.mkdir()
    tb = dsmonitor.TensorBoardMonitor(dsconfig.TensorBoardConfig(enabled=False, output_path=str(tmp_path),
                                                                 job_name="tb"))
    csv_monitor = dsmonitor.CSVMonitor(dsconfig.CSVMonitorConfig(enabled=False, output_path=str(tmp_path),
                                                                 job_name="csv"))
    for monitor in (tb, csv_monitor):
        monitor.write_events([("loss", 1.0, 1)])
        monitor.flush()
        monitor.close()
    assert (tb.enabled, tb.summary_writer, csv_monitor.enabled) == (False, None, False)
    assert list(tmp_path.iterdir()) == []


def test_disabled_wandb_and_comet_monitors_do_nothing(monkeypatch):
    # As DeepSpeed's: built from a disabled section, they open no run / experiment and need neither package.
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # importing either would now fail
    monkeypatch.setitem(sys.modules, "comet_ml", None)
    wandb = dsmonitor.WandbMonitor(dsconfig.WandbConfig(enabled=False, group="g", team="t", project="p"))
    comet = dsmonitor.CometMonitor(dsconfig.CometConfig(enabled=False, samples_log_interval=7))
    for monitor in (wandb, comet):
        monitor.write_events([("loss", 1.0, 1)])
        monitor.flush()
        monitor.close()
    assert (wandb.enabled, wandb.group, wandb.team, wandb.project, wandb.run) == (False, "g", "t", "p", None)
    assert (comet.enabled, comet.samples_log_interval, comet.experiment) == (False, 7, None)
