"""Everything the engine reports around the loop: the steps_per_print line, monitor events, the
wall-clock breakdown and the flops profile at `flops_profiler.profile_step`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import dsmonitor
from dsmonitor import events

from .logs import log_on_rank0

if TYPE_CHECKING:
    from .engine import DeepSpeedEngine

BREAKDOWN = (events.FORWARD_GLOBAL_TIMER, events.BACKWARD_GLOBAL_TIMER, events.BACKWARD_INNER_GLOBAL_TIMER,
             events.BACKWARD_REDUCE_GLOBAL_TIMER, events.STEP_GLOBAL_TIMER)


class _NullTimer:
    def start(self) -> None:
        pass

    def stop(self, *args, **kwargs) -> None:
        pass


_NULL_TIMER = _NullTimer()


class StepReporter:
    def __init__(self, engine: DeepSpeedEngine):
        cfg = engine._config
        self.engine = engine
        self.rank = engine.global_rank
        self.steps_per_print = cfg.steps_per_print
        self.profiler_cfg = cfg.flops_profiler
        self.breakdown = cfg.wall_clock_breakdown or cfg.flops_profiler.enabled
        self.timers = dsmonitor.SynchronizedWallClockTimer(synchronize=torch.cuda.is_available()) \
            if self.breakdown else None
        self.monitor = dsmonitor.MonitorMaster.from_config(cfg, rank=self.rank)
        self.profiler = None
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0

    # ------------------------------------------------------------------ timers
    def timer(self, name: str):
        return self.timers(name) if self.timers is not None else _NULL_TIMER

    # ------------------------------------------------------------------ per micro-step
    def before_forward(self) -> None:
        cfg = self.profiler_cfg
        if cfg.enabled and self.rank == 0 and self.engine.global_steps + 1 == cfg.profile_step \
                and self.profiler is None:
            self.profiler = dsmonitor.FlopsProfiler(self.engine.module, ds_engine=self.engine)
            self.profiler.start_profile()

    def record_loss(self, loss: torch.Tensor) -> None:
        value = loss.detach().float()
        self._loss_sum = value if self._loss_sum is None else self._loss_sum + value
        self._loss_count += 1

    # ------------------------------------------------------------------ per optimizer step
    def after_step(self) -> None:
        engine = self.engine
        step, samples = engine.global_steps, engine.global_samples
        if self.monitor.enabled:
            lrs = engine.get_lr()
            batch = [(events.LR, lrs[0], samples)] if lrs else []
            if self._loss_sum is not None:
                batch.append((events.TRAIN_LOSS, (self._loss_sum / self._loss_count).item(), samples))
            if engine.fp16_enabled():
                batch.append((events.LOSS_SCALE, engine.loss_scale, samples))
            if self.timers is not None:
                batch += self.timers.events(samples)
            self.monitor.write_events(batch)
        self._loss_sum, self._loss_count = None, 0
        if step % self.steps_per_print == 0:
            line = f"step={step}, skipped={engine.skipped_steps}, lr={engine.get_lr()}, mom={engine.get_mom()}"
            if engine.fp16_enabled():
                line += f", loss_scale={engine.loss_scale}"
            log_on_rank0(self.rank, line)
            if self.timers is not None:
                self.timers.log(BREAKDOWN, reset=False, ranks=[0])
        if self.timers is not None:
            for name in BREAKDOWN:
                if self.timers.has(name):
                    self.timers(name).reset()
        if self.profiler is not None and step == self.profiler_cfg.profile_step:
            cfg = self.profiler_cfg
            self.profiler.stop_profile()
            self.profiler.print_model_profile(profile_step=step, module_depth=cfg.module_depth,
                                              top_modules=cfg.top_modules, detailed=cfg.detailed,
                                              output_file=cfg.output_file)
            self.profiler.end_profile()

    def close(self) -> None:
        self.monitor.close()
