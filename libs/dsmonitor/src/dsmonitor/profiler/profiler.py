"""FlopsProfiler and get_model_profile, with DeepSpeed's names and signatures."""

import sys
from collections.abc import Iterable

import torch

from ..errors import MonitorConfigError, MonitorError
from .hooks import ModuleAccounting
from .report import render
from .stats import ModuleStats, duration_to_string, macs_to_string, number_to_string, params_to_string


def _check_print_args(module_depth: int, top_modules: int) -> None:
    if module_depth < -1:
        raise MonitorConfigError(f"module_depth must be -1 (every depth) or 0 or more, got {module_depth}")
    if top_modules < 1:
        raise MonitorConfigError(f"top_modules must be at least 1, got {top_modules}")


class FlopsProfiler:
    """Profiles the forward passes of `model` between start_profile() and stop_profile()."""

    def __init__(self, model: torch.nn.Module, ds_engine=None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise MonitorConfigError(f"FlopsProfiler profiles a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        # The engine the profile is taken under (DeepSpeed's signature): print_model_profile reports its layout
        # (world_size, dp_world_size, mp_world_size, train_micro_batch_size_per_gpu(), read by name).
        self.ds_engine = ds_engine
        self.started = False
        self._accounting: ModuleAccounting | None = None
        # The figures of the last printed profile: they stay after end_profile() (None before any).
        self.flops: int | None = None
        self.macs: int | None = None
        self.params: int | None = None

    def start_profile(self, ignore_list: Iterable[type] | None = None) -> None:
        """Count from now on; modules whose type is in ignore_list get no entry of their own."""
        if self.started:
            raise MonitorError("start_profile() called twice; call stop_profile() first")
        self._accounting = ModuleAccounting(self.model, tuple(ignore_list or ()))
        self._accounting.start()
        self.started = True

    def stop_profile(self) -> None:
        """Stop counting; the figures stay readable until end_profile()."""
        if self.started:
            self._accounting.stop()
            self.started = False

    def reset_profile(self) -> None:
        """Zero the figures, keep profiling."""
        self._stats_or_raise()
        self._accounting.reset()

    def end_profile(self) -> None:
        """Stop and drop the figures."""
        self.stop_profile()
        self._accounting = None

    def _stats_or_raise(self) -> ModuleAccounting:
        if self._accounting is None:
            raise MonitorError("no profile: call start_profile(), run the model, then read the figures")
        return self._accounting

    def module_stats(self) -> list[ModuleStats]:
        """Every profiled module's figures, the model first, in named_modules order."""
        return list(self._stats_or_raise().stats.values())

    def _root(self) -> ModuleStats:
        return self._stats_or_raise().stats[self.model]

    def get_total_flops(self, as_string: bool = False):
        flops = self._root().flops
        return number_to_string(flops) if as_string else flops

    def get_total_macs(self, as_string: bool = False):
        macs = self._root().macs
        return macs_to_string(macs) if as_string else macs

    def get_total_params(self, as_string: bool = False):
        params = self._root().params
        return params_to_string(params) if as_string else params

    def get_total_duration(self, as_string: bool = False):
        """Seconds spent in the model's forward passes while profiling."""
        duration = self._root().duration
        return duration_to_string(duration) if as_string else duration

    def print_model_profile(self, profile_step: int = 1, module_depth: int = -1, top_modules: int = 1,
                            detailed: bool = True, output_file: str | None = None) -> str:
        """Print (or write to output_file) the profile; returns the text too. The totals printed stay readable as
        `flops`, `macs` and `params` after end_profile()."""
        _check_print_args(module_depth, top_modules)
        stats = self.module_stats()
        text = render(stats, profile_step, module_depth, top_modules, detailed, self.ds_engine)
        self.flops, self.macs, self.params = stats[0].flops, stats[0].macs, stats[0].params
        if output_file is None:
            sys.stdout.write(text)
        else:
            with open(output_file, "w") as f:
                f.write(text)
        return text


def _example_input(model: torch.nn.Module, input_shape) -> torch.Tensor:
    if not (isinstance(input_shape, (tuple, list)) and input_shape
            and all(isinstance(d, int) and d > 0 for d in input_shape)):
        raise MonitorConfigError(f"input_shape must be a non-empty tuple of positive ints, got {input_shape!r}")
    param = next(model.parameters(), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    device = param.device if param is not None else torch.device("cpu")
    return torch.randn(tuple(input_shape), dtype=dtype, device=device)


def get_model_profile(model: torch.nn.Module, input_shape=None, args=(), kwargs=None, print_profile: bool = True,
                      detailed: bool = True, module_depth: int = -1, top_modules: int = 1, warm_up: int = 1,
                      as_string: bool = True, output_file: str | None = None, ignore_modules=None):
    """Profile one forward pass after `warm_up` others; returns (flops, macs, params)."""
    kwargs = dict(kwargs or {})
    args = tuple(args)
    if input_shape is not None:
        if args or kwargs:
            raise MonitorConfigError("give either input_shape or args / kwargs, not both")
        args = (_example_input(model, input_shape),)
    elif not args and not kwargs:
        raise MonitorConfigError("get_model_profile needs input_shape, or args and/or kwargs to call the model with")
    if warm_up < 0:
        raise MonitorConfigError(f"warm_up must be 0 or more, got {warm_up}")
    _check_print_args(module_depth, top_modules)
    for _ in range(warm_up):
        model(*args, **kwargs)
    prof = FlopsProfiler(model)
    prof.start_profile(ignore_list=ignore_modules)
    try:
        model(*args, **kwargs)
    finally:
        prof.stop_profile()
    flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
    if print_profile:
        prof.print_model_profile(profile_step=warm_up, module_depth=module_depth, top_modules=top_modules,
                                 detailed=detailed, output_file=output_file)
    prof.end_profile()
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params
