"""The communication logger: which ops to record, and the records themselves.

Timing never adds a device-wide synchronisation: a CPU op is timed around the call (or, when
asynchronous, by its future's completion), a CUDA op by a pair of events on its stream, read when
the log is summarised.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, get_args

import attrs

from dsconfig import CommsLoggerConfig
from dsconfig.sections.monitor import CommOp

from .bandwidth import bandwidths, size_str
from .errors import CommError

KNOWN_OPS = frozenset(get_args(CommOp))


@attrs.define
class Record:
    name: str        # log_name, with the caller when debug is on
    op: str
    nbytes: int
    group_size: int
    latency_ms: float | None = None
    _events: Any = None  # (start, end) CUDA events until resolved

    def resolve(self) -> None:
        if self.latency_ms is None and self._events is not None:
            start, end = self._events
            end.synchronize()
            self.latency_ms = float(start.elapsed_time(end))
            self._events = None


@attrs.define
class CommsLogger:
    enabled: bool = False
    verbose: bool = False
    prof_all: bool = True
    debug: bool = False
    prof_ops: frozenset[str] = frozenset()
    records: list[Record] = attrs.Factory(list)

    def configure(self, config: CommsLoggerConfig | None = None, **overrides: Any) -> None:
        settings = attrs.asdict(config) if config is not None else {}
        settings.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(settings) - {"enabled", "verbose", "prof_all", "debug", "prof_ops"}
        if unknown:
            raise CommError(f"configure: unknown settings {sorted(unknown)}; valid: enabled, verbose, prof_all, "
                            f"debug, prof_ops")
        ops = settings.get("prof_ops", self.prof_ops)
        bad = sorted(set(ops) - KNOWN_OPS)
        if bad:
            raise CommError(f"comms_logger.prof_ops: unknown ops {bad}; valid: {', '.join(sorted(KNOWN_OPS))}")
        for key, value in settings.items():
            setattr(self, key, frozenset(value) if key == "prof_ops" else bool(value))

    def wants(self, op: str, prof: bool) -> bool:
        return self.enabled and (prof or self.prof_all or op in self.prof_ops)

    def name_for(self, op: str, log_name: str | None) -> str:
        name = log_name or op
        if self.debug:
            name = f"{name} [caller: {_caller()}]"
        return name

    def add(self, record: Record) -> None:
        self.records.append(record)
        if self.verbose:
            record.resolve()
            algbw, busbw = bandwidths(record.op, record.nbytes, record.latency_ms or 0.0, record.group_size)
            print(f"dscomm: {record.name} | {size_str(record.nbytes)} | {record.latency_ms:.3f} ms | "
                  f"algbw {algbw:.3f} GB/s | busbw {busbw:.3f} GB/s", flush=True)

    def reset(self) -> None:
        self.records.clear()


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _caller() -> str:
    """The first frame outside the dscomm package: the user's function that issued the op."""
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"


class Timer:
    """Times one op: wall clock for CPU tensors, CUDA events for CUDA tensors."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        if cuda:
            import torch

            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def finish(self, record: Record) -> Record:
        if self.cuda:
            self.end.record()
            record._events = (self.start, self.end)
        else:
            record.latency_ms = (time.perf_counter() - self.t0) * 1e3
        return record


LOGGER = CommsLogger()
