"""What a backend is, and where the file-based backends write."""

import os
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

Event = tuple[str, float, int]  # (name, value, step)


@runtime_checkable
class Backend(Protocol):
    """A monitoring backend. Calls come from one thread at a time (the master's writer thread)."""

    name: str

    def write_events(self, events: Sequence[Event]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def log_dir(output_path: str | None, job_name: str, subdir: str = "") -> str:
    """`output_path/job_name[/subdir]`; no output_path means the launching (current) directory."""
    base = output_path if output_path else os.getcwd()
    path = os.path.join(base, job_name, subdir) if subdir else os.path.join(base, job_name)
    return os.path.abspath(os.path.expanduser(path))
