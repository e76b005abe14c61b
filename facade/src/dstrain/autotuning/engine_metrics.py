"""The engine's side of an autotuning experiment: measure, write the metrics file, end the run.

The autotuner launches each experiment with DSTRAIN_AUTOTUNING_METRICS=<file>. Only then does
initialize() add this step hook (so a config with autotuning.enabled trains as usual otherwise):

- optimizer steps start_profile_step..end_profile_step are timed with a dsmonitor timer (it
  synchronises the device), from the end of the step before to the end of the last;
- one step outside that window (the one before it, or the one after it when the window starts at
  step 1) runs under dsmonitor's FlopsProfiler, so its hooks cost the timed steps nothing; the
  backward pass is counted as twice the forward, as DeepSpeed counts it;
- the peak and resident memory over the window (device memory on a GPU; on the CPU the process's
  RSS, its peak reset when the window opens) and the model's size feed the autotuner's memory estimate for the next points.

Rank 0 writes the file (atomically), then every rank leaves at once with exit code 0 (see _end_run):
the experiment has what it came for, and the launcher sees a clean exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
from typing import Any

import torch

import dsmonitor
from dsconfig import DeepSpeedConfig

from ..logs import log_on_rank0
from .owned_dirs import write_file_no_follow

METRICS_ENV = "DSTRAIN_AUTOTUNING_METRICS"
BACKWARD_FACTOR = 2.0  # backward costs about twice the forward's flops


def experiment_hooks(cfg: DeepSpeedConfig, module: torch.nn.Module, *, rank: int) -> list:
    """The step hooks of an autotuning experiment: one ProfileWindow when the autotuner asks, else none."""
    path = os.environ.get(METRICS_ENV)
    if not path:
        if cfg.autotuning.enabled:
            log_on_rank0(rank, "autotuning.enabled: training as configured; the search itself runs from the "
                               "launcher: `dstrain --autotuning tune|run script.py --deepspeed_config ...`")
        return []
    return [ProfileWindow(cfg, module, path, rank=rank)]


class ProfileWindow:
    """Called with the global step after each optimizer step."""

    def __init__(self, cfg: DeepSpeedConfig, module: torch.nn.Module, path: str, *, rank: int) -> None:
        tuning = cfg.autotuning
        self.path = path
        self.rank = rank
        self.module = module
        self.first = max(tuning.start_profile_step, 1)
        self.last = max(tuning.end_profile_step, self.first)
        self.flops_step = self.first - 1 if self.first >= 2 else self.last + 1
        self.train_batch_size = cfg.train_batch_size
        self.micro_batch = cfg.train_micro_batch_size_per_gpu
        self.gas = cfg.gradient_accumulation_steps
        self.stage = cfg.zero_optimization.stage
        self.cuda = torch.cuda.is_available()
        self.timer = dsmonitor.SynchronizedWallClockTimer(synchronize=self.cuda)("autotuning_profile_window")
        # Counted now: after initialize() ZeRO-3 leaves only shards in the module.
        self.num_params = sum(p.numel() for p in module.parameters())
        self.trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
        self.largest_layer = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in module.modules()),
                                 default=0)
        self.profiler: Any = None
        self.forward_flops: float | None = None
        self.flops_error = ""
        self.memory: dict[str, float] = {}
        if self.flops_step == 1:
            self._start_flops()
        if self.first == 1:
            self._open_window()

    def __call__(self, step: int) -> None:
        if step == self.flops_step:
            self._stop_flops()
        if step == self.last:
            self.timer.stop()
            self.memory = self._memory()
        if step == self.first - 1:
            self._open_window()
        if step == self.flops_step - 1:
            self._start_flops()
        if step >= max(self.last, self.flops_step):
            self._finish()

    # ------------------------------------------------------------------ measuring
    def _open_window(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            _reset_peak_rss()
        self.timer.start()

    def _start_flops(self) -> None:
        try:
            self.profiler = dsmonitor.FlopsProfiler(self.module)
            self.profiler.start_profile()
        except Exception as exc:  # a model the profiler cannot hook: the other metrics still count
            self.profiler, self.flops_error = None, f"the flops profiler failed: {exc}"

    def _stop_flops(self) -> None:
        if self.profiler is None:
            return
        try:
            self.profiler.stop_profile()
            self.forward_flops = float(self.profiler.get_total_flops())
            self.profiler.end_profile()
        except Exception as exc:
            self.flops_error = f"the flops profiler failed: {exc}"
        self.profiler = None

    def _memory(self) -> dict[str, float]:
        if self.cuda:
            device = torch.cuda.current_device()
            peak, resident = torch.cuda.max_memory_allocated(device), torch.cuda.memory_allocated(device)
            capacity = torch.cuda.get_device_properties(device).total_memory
        else:
            peak, resident = _rss_bytes("VmHWM"), _rss_bytes("VmRSS")
            local = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
            capacity = resident + _available_host_bytes() / local  # this rank's share of what is free
        values = torch.tensor([peak, resident, -capacity], dtype=torch.float64,
                              device=torch.device("cuda", torch.cuda.current_device()) if self.cuda else "cpu")
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)  # the tightest rank counts
        peak, resident, capacity = values.tolist()
        return {"peak_memory_bytes": peak, "resident_memory_bytes": resident, "device_memory_bytes": -capacity,
                "activation_memory_bytes": max(peak - resident, 0.0)}

    # ------------------------------------------------------------------ the file
    def _finish(self) -> None:
        if self.rank == 0:
            steps = self.last - self.first + 1
            seconds = self.timer.elapsed(reset=False) / 1000.0
            latency_ms = 1000.0 * seconds / steps
            step_flops = (1.0 + BACKWARD_FACTOR) * self.forward_flops if self.forward_flops else None
            flops = step_flops / (seconds / steps) if step_flops and seconds > 0 else None
            metrics = {
                "latency": latency_ms, "throughput": self.train_batch_size * steps / seconds if seconds > 0 else None,
                "flops": flops, "FLOPS_per_gpu": flops, "flops_per_step": step_flops,
                "profile_steps": [self.first, self.last], "flops_step": self.flops_step,
                "zero_stage": self.stage, "train_batch_size": self.train_batch_size,
                "train_micro_batch_size_per_gpu": self.micro_batch, "gradient_accumulation_steps": self.gas,
                "num_params": self.num_params, "trainable_num_params": self.trainable,
                "largest_layer_params": self.largest_layer,
                "memory_kind": "cuda" if self.cuda else "host", **self.memory,
            }
            if flops is None:
                metrics["flops_error"] = self.flops_error or "no forward pass was counted"
            # Into the experiment folder the tuner made, through neither a link in its place nor one at the names.
            write_file_no_follow(self.path, json.dumps(metrics, indent=2))
            log_on_rank0(self.rank, f"autotuning experiment: steps {self.first}-{self.last} measured, "
                                    f"{latency_ms:.1f} ms/step; metrics in {self.path}; ending the run")
        _end_run()


def _end_run() -> None:
    """Every rank leaves together, at once: a barrier (nobody is still talking to a rank that is gone),
    then os._exit. Interpreter teardown with the process groups still alive can abort (SIGABRT from a
    joinable thread), which would turn a measured experiment into a crash; the experiment keeps nothing
    but its metrics file, so nothing is lost by skipping it."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


def _reset_peak_rss() -> None:
    """Start the process's peak RSS (VmHWM) afresh, so it covers the window only (Linux 4.0+)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _rss_bytes(field: str) -> float:
    """VmRSS (resident now) or VmHWM (the peak) of this process, from /proc/self/status."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) if field == "VmHWM" else 0.0


def _available_host_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
