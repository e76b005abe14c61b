import importlib.metadata
import json
import subprocess
import sys

import dsmonitor


def test_version_matches_installed_metadata():
    assert dsmonitor.__version__ == importlib.metadata.version("dsmonitor")


def test_import_loads_no_backend_and_no_torch():
    code = ("import sys, json, dsmonitor; "
            "print(json.dumps([m for m in ('torch', 'wandb', 'comet_ml', 'tensorboard') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_public_api_is_listed():
    for name in dsmonitor.__all__:
        assert getattr(dsmonitor, name) is not None


def test_event_names_are_the_references():
    e = dsmonitor.events
    assert e.TRAIN_LOSS == "Train/Samples/train_loss"
    assert e.LR == "Train/Samples/lr"
    assert e.LOSS_SCALE == "Train/Samples/loss_scale"
    assert [f"Train/Samples/elapsed_time_ms_{s}" for s in
                                ("forward", "backward", "backward_inner", "backward_allreduce", "step")] == [e.ELAPSED_FORWARD, e.ELAPSED_BACKWARD, e.ELAPSED_BACKWARD_INNER, e.ELAPSED_BACKWARD_ALLREDUCE,
            e.ELAPSED_STEP]


def test_missing_package_names_the_extra(tmp_path):
    # A None entry in sys.modules makes `import wandb` fail as if it were not installed.
    code = ("import sys; sys.modules['wandb'] = None\n"
            "import dsconfig, dsmonitor\n"
            "try:\n"
            "    dsmonitor.MonitorMaster(wandb=dsconfig.WandbConfig(enabled=True))\n"
            "except dsmonitor.MissingExtraError as exc:\n"
            "    assert isinstance(exc, ImportError)\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout
    assert 'pip install "dsmonitor[wandb]"' in out
