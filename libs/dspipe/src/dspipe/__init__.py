"""dspipe: pipeline parallelism with DeepSpeed's PipelineModule API on pure, simulated schedules.

    from dspipe.schedules import build_schedule, placement, lower, validate, simulate
    compute = build_schedule("zb_h1", stages=4, micro_batches=8)    # one action list per pipeline rank
    program = lower(compute, placement("zb_h1", ranks=4, stages=4))  # + sends, receives, loads, step
    validate(program)                                                # every dependency, every send met
    print(simulate(compute).bubble)                                  # 0.125 = (p-1)/(3m)

`dspipe.schedules` and `dspipe.cli` are plain Python and import without torch; the torch parts
(PipelineModule, the runtime) load on first use of their names.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__
from .errors import PipelineError, ScheduleError

# Public name -> the submodule that defines it. Names that need torch live here so that
# `import dspipe.schedules` works where torch is not installed.
_LAZY: dict[str, str] = {
    "PipelineModule": ".module",
    "DualPipeVModule": ".module",
    "LayerSpec": ".layers",
    "TiedLayerSpec": ".layers",
    "partition_uniform": ".partition",
    "partition_balanced": ".partition",
    "prefix_sum_inc": ".partition",
    "PipelineRuntime": ".runtime",
    "GradientSync": ".runtime",
    "AveragedOptimizer": ".runtime",
}

__all__ = ["__version__", "PipelineError", "ScheduleError", "schedules", *_LAZY]


def __getattr__(name: str) -> Any:
    if name == "schedules":
        return importlib.import_module(".schedules", __name__)
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dspipe' has no attribute {name!r}")
