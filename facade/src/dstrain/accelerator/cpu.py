"""The CPU as an accelerator: work runs in program order, memory is the host's, gloo communicates.

Where DeepSpeed's CPU accelerator returns None (Event, Stream), this one gives objects that work on
the host, so timing code written for GPUs runs unchanged.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from typing import Any

import torch

from .base import Accelerator, local_rank


class HostEvent:
    """An event recorded on the host clock: `record()`, `synchronize()`, `elapsed_time(other)` in ms."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self.time: float | None = None

    def record(self, stream: Any = None) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return self.time is not None

    def elapsed_time(self, end_event: HostEvent) -> float:
        if self.time is None or end_event.time is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end_event.time - self.time) * 1000.0


class HostStream:
    """Work on the CPU runs in order: a stream is only a context and a no-op to wait on."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        self.device = torch.device("cpu")

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: HostEvent | None = None) -> HostEvent:
        event = event or HostEvent()
        event.record()
        return event

    def query(self) -> bool:
        return True


_DEFAULT_STREAM = HostStream()


def _meminfo() -> dict[str, int]:
    values = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            values[name] = int(rest.split()[0]) * 1024
    return values


class CpuAccelerator(Accelerator):
    _name = "cpu"
    _communication_backend = "gloo"

    # ------------------------------------------------------------------ devices
    def device_name(self, device_index: int | None = None) -> str:
        return "cpu"  # one device type, whatever the index: tensors go to "cpu"

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        # One "device" per local rank: torchrun's LOCAL_WORLD_SIZE, else LOCAL_SIZE (DeepSpeed's launcher and test
        # harness set it, and DeepSpeed's CPU accelerator counts it as its devices), else one.
        return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or 1)

    def current_device(self) -> int:
        return local_rank()

    def current_device_name(self) -> str:
        return "cpu"

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def is_synchronized_device(self) -> bool:
        return True

    # ------------------------------------------------------------------ streams and events
    @property
    def Stream(self) -> type:  # DeepSpeed's name
        return HostStream

    @property
    def Event(self) -> type:
        return HostEvent

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def current_stream(self, device_index: int | None = None) -> HostStream:
        return _DEFAULT_STREAM

    def default_stream(self, device_index: int | None = None) -> HostStream:
        return _DEFAULT_STREAM

    # ------------------------------------------------------------------ memory (the host's)
    def empty_cache(self) -> None:
        pass

    def memory_allocated(self, device_index: int | None = None) -> int:
        with contextlib.suppress(OSError), open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return 0

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        pass

    def memory_reserved(self, device_index: int | None = None) -> int:
        return self.memory_allocated(device_index)

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        return self.max_memory_allocated(device_index)

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        pass

    def memory_stats(self, device_index: int | None = None) -> dict[str, int]:
        return {"allocated_bytes.all.current": self.memory_allocated(),
                "allocated_bytes.all.peak": self.max_memory_allocated()}

    def total_memory(self, device_index: int | None = None) -> int:
        return _meminfo().get("MemTotal", 0)

    def available_memory(self, device_index: int | None = None) -> int:
        return _meminfo().get("MemAvailable", 0)
