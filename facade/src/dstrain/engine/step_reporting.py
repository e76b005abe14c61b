"""Everything reported around the training loop: the steps_per_print line, monitor events, the
wall-clock breakdown and the flops profile at `flops_profiler.profile_step`. It reads the progress
counters, the module and the optimizers it is handed, nothing else."""

from __future__ import annotations

from typing import Any

import torch

import dsmonitor
from dsconfig import DeepSpeedConfig, FlopsProfilerConfig
from dsmonitor import events

from ..logs import log_on_rank0
from .progress import TrainingProgress

BREAKDOWN = (events.FORWARD_GLOBAL_TIMER, events.BACKWARD_GLOBAL_TIMER, events.BACKWARD_INNER_GLOBAL_TIMER,
             events.BACKWARD_REDUCE_GLOBAL_TIMER, events.STEP_GLOBAL_TIMER)


class _NullTimer:
    def start(self) -> None:
        pass

    def stop(self, *args, **kwargs) -> None:
        pass


_NULL_TIMER = _NullTimer()


def learning_rates(optimizer: Any) -> list[float]:
    """Each parameter group's learning rate (what get_lr() reports)."""
    return [group["lr"] for group in optimizer.param_groups] if optimizer is not None else []


def momenta(optimizer: Any) -> list[Any]:
    """Each parameter group's betas or momentum (what get_mom() reports)."""
    if optimizer is None:
        return []
    return [group.get("betas", group.get("momentum")) for group in optimizer.param_groups]


class StepReporter:
    """Reports for `module` trained with `progress`; `after_step` is handed the optimizers of the step.

    `step_hooks` (the composition's, e.g. a curriculum's schedule) are called after each optimizer step
    with the global step; the (label, value) events a hook returns go to the monitors."""

    def __init__(self, *, rank: int, module: torch.nn.Module, progress: TrainingProgress, fp16: bool,
                 steps_per_print: int, wall_clock_breakdown: bool, flops_profiler: FlopsProfilerConfig,
                 monitor: dsmonitor.MonitorMaster, step_hooks: list | None = None, train_batch_size: int = 1):
        self.rank = rank
        self.step_hooks = step_hooks if step_hooks is not None else []
        self.module = module
        self.progress = progress
        self.fp16 = fp16
        self.steps_per_print = steps_per_print
        self.profiler_cfg = flops_profiler
        self.breakdown = wall_clock_breakdown or flops_profiler.enabled
        self.timers = dsmonitor.SynchronizedWallClockTimer(synchronize=torch.cuda.is_available()) \
            if self.breakdown else None
        self.monitor = monitor
        # Samples per second over the steps after two of warm-up (DeepSpeed's engine.tput_timer); its progress
        # line is printed every steps_per_print steps with the wall-clock breakdown.
        self.throughput = dsmonitor.ThroughputTimer(train_batch_size, start_step=2, steps_per_output=steps_per_print,
                                                    logging_fn=lambda line: log_on_rank0(rank, line),
                                                    synchronize=torch.cuda.is_available())
        # DeepSpeed's engine.flops_profiler: built with the engine when the profiler is enabled; rank 0 profiles
        # the step flops_profiler.profile_step, and the printed totals stay as profiler.flops / .macs / .params.
        self.profiler = dsmonitor.FlopsProfiler(module) if flops_profiler.enabled else None
        self._profiling = False
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0

    @classmethod
    def from_config(cls, cfg: DeepSpeedConfig, *, rank: int, module: torch.nn.Module, progress: TrainingProgress,
                    fp16: bool, step_hooks: list | None = None) -> StepReporter:
        return cls(rank=rank, module=module, progress=progress, fp16=fp16, steps_per_print=cfg.steps_per_print,
                   wall_clock_breakdown=cfg.wall_clock_breakdown, flops_profiler=cfg.flops_profiler,
                   monitor=dsmonitor.MonitorMaster.from_config(cfg, rank=rank), step_hooks=step_hooks,
                   train_batch_size=cfg.train_batch_size)

    # ------------------------------------------------------------------ timers
    def timer(self, name: str):
        return self.timers(name) if self.timers is not None else _NULL_TIMER

    # ------------------------------------------------------------------ per micro-step
    def before_forward(self) -> None:
        if not self.throughput.started:  # from the first forward of a micro-step to its engine.step()
            self.throughput.start()
        cfg = self.profiler_cfg
        if self.profiler is not None and self.rank == 0 and self.progress.global_steps + 1 == cfg.profile_step \
                and not self._profiling and self.profiler.flops is None:
            self.profiler.start_profile()
            self._profiling = True

    def record_loss(self, loss: torch.Tensor) -> None:
        value = loss.detach().float()
        self._loss_sum = value if self._loss_sum is None else self._loss_sum + value
        self._loss_count += 1

    # ------------------------------------------------------------------ per optimizer step
    def micro_step_done(self, boundary: bool) -> None:
        """engine.step() ended a micro-step (`boundary`: with an optimizer step)."""
        self.throughput.stop(global_step=boundary, report_speed=self.breakdown)

    def after_step(self, optimizer: Any, basic_optimizer: Any) -> None:
        """After an optimizer step: `optimizer` the ZeRO optimizer (loss scale, skipped steps),
        `basic_optimizer` the one whose parameter groups hold the learning rates."""
        step, samples = self.progress.global_steps, self.progress.global_samples
        hook_events = [event for hook in self.step_hooks for event in (hook(step) or ())]
        if self.monitor.enabled:
            lrs = learning_rates(basic_optimizer)
            batch = [(events.LR, lrs[0], samples)] if lrs else []
            if self._loss_sum is not None:
                batch.append((events.TRAIN_LOSS, (self._loss_sum / self._loss_count).item(), samples))
            if self.fp16:
                batch.append((events.LOSS_SCALE, optimizer.loss_scale, samples))
            if self.timers is not None:
                batch += self.timers.events(samples)
            batch += [(label, value, samples) for label, value in hook_events]
            self.monitor.write_events(batch)
        self._loss_sum, self._loss_count = None, 0
        if step % self.steps_per_print == 0:
            line = (f"step={step}, skipped={optimizer.skipped_steps}, lr={learning_rates(basic_optimizer)}, "
                    f"mom={momenta(basic_optimizer)}")
            if self.fp16:
                line += f", loss_scale={optimizer.loss_scale}"
            log_on_rank0(self.rank, line)
            if self.timers is not None:
                self.timers.log(BREAKDOWN, reset=False, ranks=[0])
        if self.timers is not None:
            for name in BREAKDOWN:
                if self.timers.has(name):
                    self.timers(name).reset()
        if self._profiling and step == self.profiler_cfg.profile_step:
            self._profiling = False
            cfg = self.profiler_cfg
            self.profiler.stop_profile()
            self.profiler.print_model_profile(profile_step=step, module_depth=cfg.module_depth,
                                              top_modules=cfg.top_modules, detailed=cfg.detailed,
                                              output_file=cfg.output_file)
            self.profiler.end_profile()

    def close(self) -> None:
        self.monitor.close()
