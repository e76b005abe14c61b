"""Every backend runs for real, offline: W&B and Comet write local files, nothing needs a key."""

import sys
from pathlib import Path

import pytest

# --import-mode=importlib keeps tests/ off sys.path; the readers module is shared by several tests.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def offline_backends(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")  # no network here: no error reports
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet_dir"))
    # Environment details (conda, git, host) make Comet's end() take seconds; the metrics do not need them.
    for flag in ("COMET_AUTO_LOG_ENV_DETAILS", "COMET_AUTO_LOG_GIT_METADATA", "COMET_AUTO_LOG_GIT_PATCH",
                 "COMET_AUTO_LOG_CO2", "COMET_AUTO_LOG_ENV_GPU", "COMET_AUTO_LOG_ENV_HOST",
                 "COMET_AUTO_LOG_ENV_CPU", "COMET_AUTO_LOG_ENV_NETWORK", "COMET_AUTO_LOG_ENV_DISK",
                 "COMET_AUTO_LOG_CODE", "COMET_AUTO_LOG_OUTPUT_LOGGER"):
        monkeypatch.setenv(flag, "false" if flag != "COMET_AUTO_LOG_OUTPUT_LOGGER" else "")
    (tmp_path / "wandb_dir").mkdir()
    monkeypatch.chdir(tmp_path)  # backends defaulting to the launching directory write here
    yield
