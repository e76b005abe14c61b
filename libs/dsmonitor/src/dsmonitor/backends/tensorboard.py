"""TensorBoard event files, written through torch's SummaryWriter as DeepSpeed does."""

import os
from collections.abc import Sequence

from .._extras import require
from .base import Event, log_dir


class TensorBoardMonitor:
    """Writes scalars to event files in `output_path/job_name/`."""

    name = "tensorboard"

    def __init__(self, config, *, subdir: str = "") -> None:
        self.log_dir = log_dir(config.output_path, config.job_name, subdir)
        # the config's fields under DeepSpeed's monitor attribute names
        self.enabled, self.output_path, self.job_name = config.enabled, config.output_path, config.job_name
        self._writer = None
        if not self.enabled:
            return  # as DeepSpeed's: a disabled monitor creates no folder and no writer (and needs no tensorboard)
        require("tensorboard", "tensorboard", "The TensorBoard monitor")
        summary = require("torch.utils.tensorboard", "tensorboard", "The TensorBoard monitor")
        os.makedirs(self.log_dir, exist_ok=True)
        self._writer = summary.SummaryWriter(log_dir=self.log_dir)

    @property
    def summary_writer(self):
        """DeepSpeed's name for the writer: None when the monitor is disabled."""
        return self._writer

    def write_events(self, events: Sequence[Event]) -> None:
        if self._writer is None:
            return
        add_scalar = self._writer.add_scalar
        for name, value, step in events:
            add_scalar(name, value, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
