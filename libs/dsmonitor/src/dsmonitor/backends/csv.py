"""Plain CSV: one file per event name under `output_path/job_name/`, header `step,value`."""

import csv
import os
from collections.abc import Sequence
from typing import IO, Any

from ..errors import MonitorError
from .base import Event, log_dir


def file_name(event_name: str) -> str:
    """`Train/Samples/lr` -> `Train_Samples_lr.csv`, as DeepSpeed names them."""
    return event_name.replace("/", "_").replace(" ", "_").replace(os.sep, "_") + ".csv"


class CSVMonitor:
    """Appends `step,value` rows; a resumed job appends to the files it finds (no second header)."""

    name = "csv_monitor"

    def __init__(self, config, *, subdir: str = "") -> None:
        self.log_dir = log_dir(config.output_path, config.job_name, subdir)
        # the config's fields under DeepSpeed's monitor attribute names
        self.enabled, self.output_path, self.job_name = config.enabled, config.output_path, config.job_name
        if self.enabled:  # as DeepSpeed's: a disabled monitor creates no folder and writes no file
            os.makedirs(self.log_dir, exist_ok=True)
        self._files: dict[str, tuple[IO[str], Any]] = {}
        self._names_by_file: dict[str, str] = {}

    def path(self, event_name: str) -> str:
        return os.path.join(self.log_dir, file_name(event_name))

    def _writer(self, event_name: str):
        fname = file_name(event_name)
        other = self._names_by_file.setdefault(fname, event_name)
        if other != event_name:
            raise MonitorError(
                f"CSV monitor: events {other!r} and {event_name!r} would share the file "
                f"{os.path.join(self.log_dir, fname)}; rename one of them")
        handle = open(os.path.join(self.log_dir, fname), "a", newline="")  # noqa: SIM115 (kept open)
        writer = csv.writer(handle)
        if handle.tell() == 0:
            writer.writerow(["step", "value"])
        self._files[event_name] = (handle, writer)
        return self._files[event_name]

    def write_events(self, events: Sequence[Event]) -> None:
        if not self.enabled:
            return
        for name, value, step in events:
            entry = self._files.get(name) or self._writer(name)
            entry[1].writerow([step, repr(float(value))])  # repr: the float reads back bit-exact

    def flush(self) -> None:
        for handle, _ in self._files.values():
            handle.flush()

    def close(self) -> None:
        for handle, _ in self._files.values():
            handle.close()
        self._files.clear()


csvMonitor = CSVMonitor  # DeepSpeed's spelling
