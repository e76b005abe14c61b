"""`deepspeed.profiling`: the flops profiler (`deepspeed.profiling.flops_profiler`) is dsmonitor's profiler."""

from ..lazy import submodule_attributes

__getattr__ = submodule_attributes(__name__, {"flops_profiler": "dsmonitor.profiler"}, "deepspeed.profiling")
