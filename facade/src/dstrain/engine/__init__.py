"""The engines and the parts they train with.

`DeepSpeedEngine` (deepspeed_engine.py) and `PipelineEngine` (pipeline_engine.py) are siblings built
from the same parts (parts.py: precision, ZeRO optimizer, scheduler, loader, progress counters,
reporter) and share their accessors through accessors.py; neither subclasses the other. Importing
this package loads no optional library: PipelineEngine (dspipe) loads on first use.
"""

from .deepspeed_engine import DeepSpeedEngine


def __getattr__(name: str):
    if name == "PipelineEngine":
        from .pipeline_engine import PipelineEngine

        return PipelineEngine
    raise AttributeError(f"module 'dstrain.engine' has no attribute {name!r}")


__all__ = ["DeepSpeedEngine", "PipelineEngine"]
