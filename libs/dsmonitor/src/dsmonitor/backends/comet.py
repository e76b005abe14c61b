"""Comet, online or as an offline experiment archive (`online: false`)."""

from collections.abc import Sequence

from .._extras import require
from ..errors import MonitorConfigError
from .base import Event


def check_comet_config(config) -> None:
    """Reject what Comet would reject later, with the config key in the message."""
    key = config.experiment_key
    if key is not None and not (key.isalnum() and key.isascii() and 32 <= len(key) <= 50):
        raise MonitorConfigError(
            f"comet.experiment_key must be 32 to 50 letters and digits, got {key!r} ({len(key)} characters)")
    if config.mode == "get" and key is None:
        raise MonitorConfigError(
            'comet.mode "get" continues an existing experiment and needs comet.experiment_key; '
            'set it, or use mode "create" or "get_or_create"')
    if config.samples_log_interval < 1:
        raise MonitorConfigError(
            f"comet.samples_log_interval must be at least 1, got {config.samples_log_interval}")


class CometMonitor:
    """Logs each event name at most once every `samples_log_interval` steps (steps count samples)."""

    name = "comet"

    def __init__(self, config) -> None:
        check_comet_config(config)
        self.enabled, self.samples_log_interval = config.enabled, config.samples_log_interval
        self.experiment = None
        self._interval = config.samples_log_interval
        self._last_logged: dict[str, int] = {}
        if not self.enabled:
            return  # as DeepSpeed's: a disabled monitor starts no experiment (and needs no comet_ml)
        comet_ml = require("comet_ml", "comet", "The Comet monitor")
        experiment_config = None
        if config.experiment_name is not None:
            experiment_config = comet_ml.ExperimentConfig(name=config.experiment_name)
        # api_key None lets comet_ml read COMET_API_KEY / its config file, as the reference advises.
        self.experiment = comet_ml.start(
            api_key=config.api_key, workspace=config.workspace, project=config.project,
            experiment_key=config.experiment_key, mode=config.mode, online=config.online,
            experiment_config=experiment_config,
        )

    def write_events(self, events: Sequence[Event]) -> None:
        if self.experiment is None:
            return
        last_logged = self._last_logged
        for name, value, step in events:
            last = last_logged.get(name)
            if last is None or step - last >= self._interval or step < last:  # step < last: a restart
                self.experiment.log_metric(name, value, step=step)
                last_logged[name] = step

    def flush(self) -> None:
        if self.experiment is not None:
            self.experiment.flush()

    def close(self) -> None:
        if self.experiment is not None:
            self.experiment.end()
