"""A measured pipeline timeline on disk: what each rank ran, and when.

Format: a JSON array of objects, one per action a rank ran,

    [{"rank": 0, "action": "0F0", "start": 0.0012, "end": 0.0105}, ...]

- "rank": the pipeline rank (int >= 0).
- "action": the action's text form (`Action.parse` reads it: "2F0", "1B3", "0I1", "0W1", "3SEND_F1", ...).
- "start", "end": seconds on one clock shared by all ranks (end >= start). Only differences matter;
  `dspipe show --from-trace` shifts the earliest start to 0.

Any number of files may hold parts of one run (one file per rank, say); `read_trace` merges them.
Compute actions make the timeline; other actions (waits on receives, the step) are shown as idle, which
is what a bubble is. The runtime records with `TraceRecorder` and writes with `write_trace`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ScheduleError
from .action import Action

MAX_TRACE_BYTES = 256 * 1024 * 1024  # a trace is a few hundred bytes per action; refuse anything absurd
MAX_RANK = 1 << 20


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One action on one rank from `start` to `end` (seconds)."""

    rank: int
    action: Action
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_json(self) -> dict[str, object]:
        return {"rank": self.rank, "action": str(self.action), "start": self.start, "end": self.end}


@dataclass
class TraceRecorder:
    """Collects the events of one rank: `with recorder.record(action): run(action)`.

    `clock` must be shared by every rank of the run for their traces to line up; time.perf_counter
    (CLOCK_MONOTONIC on Linux) is, on one host; pass time.time across hosts.
    """

    rank: int
    clock: Callable[[], float] = time.perf_counter
    events: list[TraceEvent] = field(default_factory=list)

    @contextmanager
    def record(self, action: Action) -> Iterator[None]:
        start = self.clock()
        try:
            yield
        finally:
            self.events.append(TraceEvent(self.rank, action, start, self.clock()))


def write_trace(path: str | os.PathLike[str], events: Iterable[TraceEvent]) -> None:
    """Write events to `path` as the JSON array described above (written whole, then renamed into place)."""
    path = Path(path)
    text = json.dumps([event.to_json() for event in events], separators=(",", ":"))
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def read_trace(*paths: str | os.PathLike[str]) -> list[TraceEvent]:
    """The events of every file, merged and sorted by (start, rank); each entry is checked before use."""
    if not paths:
        raise ScheduleError("read_trace needs at least one trace file")
    events: list[TraceEvent] = []
    for path in paths:
        events.extend(_read_one(Path(path)))
    events.sort(key=lambda e: (e.start, e.rank, e.end))
    return events


def _read_one(path: Path) -> list[TraceEvent]:
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise ScheduleError(f"{path}: trace file is {size} bytes, more than the {MAX_TRACE_BYTES} allowed")
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ScheduleError(f"{path}: cannot read trace file: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise ScheduleError(f"{path}: not a JSON trace: {exc}") from exc
    if not isinstance(data, list):
        raise ScheduleError(f"{path}: a trace is a JSON array of {{rank, action, start, end}} objects, "
                            f"got a {type(data).__name__}")
    return [_event(path, i, entry) for i, entry in enumerate(data)]


def _event(path: Path, index: int, entry: object) -> TraceEvent:
    where = f"{path}: entry [{index}]"
    if not isinstance(entry, dict):
        raise ScheduleError(f"{where}: expected an object with rank, action, start, end; got {type(entry).__name__}")
    missing = [key for key in ("rank", "action", "start", "end") if key not in entry]
    if missing:
        raise ScheduleError(f"{where}: missing {', '.join(missing)}")
    rank = entry["rank"]
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < MAX_RANK:
        raise ScheduleError(f"{where}: rank must be an int in 0..{MAX_RANK - 1}, got {rank!r}")
    try:
        action = Action.parse(entry["action"])
    except ScheduleError as exc:
        raise ScheduleError(f"{where}: {exc}") from None
    times = []
    for key in ("start", "end"):
        value = entry[key]
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise ScheduleError(f"{where}: {key} must be a finite number of seconds, got {value!r}")
        times.append(float(value))
    if times[1] < times[0]:
        raise ScheduleError(f"{where}: end {times[1]} is before start {times[0]}")
    return TraceEvent(rank, action, times[0], times[1])
