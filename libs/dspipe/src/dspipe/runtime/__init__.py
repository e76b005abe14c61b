"""The torch side of dspipe: a lowered schedule run on real ranks (`PipelineRuntime`), through the
gradient-sync seam (`GradientSync`) that a ZeRO optimizer or `AveragedOptimizer` fills."""

from .runtime import PipelineRuntime, check_schedule
from .sync import AveragedOptimizer, GradientSync

__all__ = ["AveragedOptimizer", "GradientSync", "PipelineRuntime", "check_schedule"]
