"""Named wall-clock timers and the throughput timer, as DeepSpeed's engine uses them.

Times are in milliseconds, as DeepSpeed reports them. Timers synchronise the device on start and
stop (when torch is in use and a device is busy) so that a time covers the kernels it launched.
"""

import logging
import time
from collections.abc import Callable, Iterable

from . import events as _events
from ._device import memory_line, synchronize
from ._rank import current_rank
from .errors import MonitorConfigError, MonitorError

logger = logging.getLogger("dsmonitor")

_REDUCE_OPS = ("max", "min", "mean")


class Timer:
    """One named timer: start/stop pairs accumulate until elapsed(reset=True) or reset()."""

    def __init__(self, name: str, sync: bool = True) -> None:
        self.name = name
        self._sync = sync
        self.started = False
        self._start = 0.0
        self._elapsed = 0.0  # seconds
        self._records: list[float] = []  # seconds, one per stop(record=True)

    def start(self) -> None:
        if self.started:
            raise MonitorError(f"timer {self.name!r} is already running; stop() it before start()")
        if self._sync:
            synchronize()
        self._start = time.perf_counter()
        self.started = True

    def stop(self, reset: bool = False, record: bool = False) -> None:
        if not self.started:
            raise MonitorError(f"timer {self.name!r} is not running; start() it before stop()")
        if self._sync:
            synchronize()
        duration = time.perf_counter() - self._start
        self._elapsed = duration if reset else self._elapsed + duration
        if record:
            self._records.append(duration)
        self.started = False

    def reset(self) -> None:
        self.started = False
        self._elapsed = 0.0
        self._records.clear()

    def elapsed(self, reset: bool = True) -> float:
        """Accumulated time in ms; a running timer is read without being stopped."""
        running = self.started
        if running:
            self.stop()
        total = self._elapsed * 1000.0
        if reset:
            self._elapsed = 0.0
        if running:
            self.start()
        return total

    def mean(self) -> float:
        """Mean of the recorded durations (stop(record=True)) in ms; 0.0 when none."""
        return 1000.0 * sum(self._records) / len(self._records) if self._records else 0.0


class SynchronizedWallClockTimer:
    """A registry of named timers: `timers("fwd").start()`, `timers("fwd").stop()`, `timers.log([...])`."""

    def __init__(self, synchronize: bool = True) -> None:
        self._sync = synchronize
        self.timers: dict[str, Timer] = {}

    def __call__(self, name: str) -> Timer:
        timer = self.timers.get(name)
        if timer is None:
            timer = self.timers[name] = Timer(name, self._sync)
        return timer

    def has(self, name: str) -> bool:
        return name in self.timers

    def get_timers(self) -> dict[str, Timer]:
        return self.timers

    def elapsed(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True) -> dict[str, float]:
        """{name: ms / normalizer} for the named timers that exist."""
        _check_normalizer(normalizer)
        return {n: self.timers[n].elapsed(reset=reset) / normalizer for n in names if n in self.timers}

    def get_mean(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True) -> dict[str, float]:
        """{name: mean recorded ms / normalizer}; reset clears the records."""
        _check_normalizer(normalizer)
        means = {}
        for name in names:
            if name in self.timers:
                means[name] = self.timers[name].mean() / normalizer
                if reset:
                    self.timers[name].reset()
        return means

    def elapsed_global(self, names: Iterable[str], reduce: str = "max", reset: bool = True,
                       group=None) -> dict[str, float]:
        """elapsed() reduced over the ranks of `group` (a collective: every rank must call it)."""
        if reduce not in _REDUCE_OPS:
            raise MonitorConfigError(f"reduce must be one of {', '.join(_REDUCE_OPS)}, got {reduce!r}")
        import torch
        import torch.distributed as dist

        names = list(names)
        local = [self.timers[n].elapsed(reset=reset) if n in self.timers else 0.0 for n in names]
        if not (dist.is_available() and dist.is_initialized()):
            return dict(zip(names, local))
        values = torch.tensor(local, dtype=torch.float64)
        if dist.get_backend(group) == "nccl":
            values = values.cuda()
        op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "mean": dist.ReduceOp.SUM}[reduce]
        dist.all_reduce(values, op=op, group=group)
        if reduce == "mean":
            values /= dist.get_world_size(group)
        return dict(zip(names, values.cpu().tolist()))

    def log(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True,
            memory_breakdown: bool = False, ranks: Iterable[int] | None = None) -> str:
        """The engine's wall_clock_breakdown line, `time (ms) | fwd: 12.34 | bwd: ...`, logged on `ranks` (default [0])."""
        line = "time (ms)" + "".join(
            f" | {name}: {ms:.2f}" for name, ms in self.elapsed(names, normalizer, reset).items())
        if memory_breakdown:
            line += memory_line()
        if current_rank() in (ranks if ranks is not None else (0,)):
            logger.info(line)
        return line

    def events(self, step: int, reset: bool = False) -> list[tuple[str, float, int]]:
        """The `Train/Samples/elapsed_time_ms_*` events for the breakdown timers that exist."""
        return [(event, self.timers[name].elapsed(reset=reset), step)
                for name, event in _events.BREAKDOWN_EVENTS.items() if name in self.timers]


def _check_normalizer(normalizer: float) -> None:
    if not normalizer > 0:
        raise MonitorConfigError(f"normalizer must be positive, got {normalizer}")


class ThroughputTimer:
    """Samples per second (and TFLOP/s given flops_per_sample) over the global steps after warm-up.

    Call start() before and stop(global_step=...) after each micro step; steps before `start_step`
    are not timed. Every `steps_per_output` global steps a progress line goes to `logging_fn`.
    """

    def __init__(self, batch_size: int, start_step: int = 2, steps_per_output: int = 50,
                 flops_per_sample: float | None = None, monitor_memory: bool = False,
                 logging_fn: Callable[[str], None] | None = None, synchronize: bool = True) -> None:
        if batch_size < 1:
            raise MonitorConfigError(f"batch_size must be at least 1, got {batch_size}")
        if start_step < 0:
            raise MonitorConfigError(f"start_step must be 0 or more, got {start_step}")
        if steps_per_output < 1:
            raise MonitorConfigError(f"steps_per_output must be at least 1, got {steps_per_output}")
        self.batch_size = batch_size
        self.start_step = start_step
        self.steps_per_output = steps_per_output
        self.flops_per_sample = flops_per_sample
        self.monitor_memory = monitor_memory
        self.logging_fn = logging_fn or logger.info
        self._sync = synchronize
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0  # seconds over timed steps
        self.step_elapsed_time = 0.0  # seconds in the current global step
        self.started = False
        self.initialized = False  # set by the first start()
        self._timed = False
        self.start_time = 0.0  # perf_counter() at the last timed start (0.0: none yet, or a warm-up step)
        self.end_time = 0.0  # perf_counter() at the last timed stop

    def update_epoch_count(self) -> None:
        self.epoch_count += 1
        self.micro_step_count = 0

    def start(self) -> None:
        self.initialized = True
        self.started = True
        self._timed = self.global_step_count >= self.start_step  # warm-up steps are not timed
        if self._timed:
            if self._sync:
                synchronize()
            self.start_time = time.perf_counter()

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        if not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if not self._timed:
            return
        if self._sync:
            synchronize()
        self.end_time = time.perf_counter()
        duration = self.end_time - self.start_time
        self.total_elapsed_time += duration
        self.step_elapsed_time += duration
        if global_step:
            if report_speed and self.global_step_count % self.steps_per_output == 0:
                self.logging_fn(self.progress_line())
            self.step_elapsed_time = 0.0

    @property
    def timed_steps(self) -> int:
        return max(0, self.global_step_count - self.start_step)

    def avg_samples_per_sec(self) -> float:
        """Mean samples/s over the timed global steps; 0.0 before the first one."""
        if self.timed_steps == 0 or self.total_elapsed_time <= 0:
            return 0.0
        return self.batch_size * self.timed_steps / self.total_elapsed_time

    def avg_tflops(self) -> float | None:
        """TFLOP/s achieved, from avg_samples_per_sec and flops_per_sample; None when flops are unknown."""
        if self.flops_per_sample is None:
            return None
        return self.avg_samples_per_sec() * self.flops_per_sample / 1e12

    def progress_line(self) -> str:
        line = (f"epoch={self.epoch_count}/micro_step={self.micro_step_count}/"
                f"global_step={self.global_step_count}, "
                f"RunningAvgSamplesPerSec={self.avg_samples_per_sec():.3f}")
        if self.step_elapsed_time > 0:
            line += f", CurrSamplesPerSec={self.batch_size / self.step_elapsed_time:.3f}"
        if self.flops_per_sample is not None:
            line += f", TFLOPS={self.avg_tflops():.3f}"
        if self.monitor_memory:
            line += memory_line().replace(" | ", ", ")
        return line
