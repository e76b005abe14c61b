"""The flops profiler: per-module flops, MACs, parameters and latency of a model's forward pass.

Imports torch; `import dsmonitor` loads this package only when FlopsProfiler or get_model_profile
is first used.
"""

from .profiler import FlopsProfiler, get_model_profile

__all__ = ["FlopsProfiler", "get_model_profile"]
