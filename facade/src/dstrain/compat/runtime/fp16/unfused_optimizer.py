"""`deepspeed.runtime.fp16.unfused_optimizer`: DeepSpeed's per-tensor fp16 optimizer's kind (none of dstrain's)."""

from ..optimizer_kinds import FP16_UnfusedOptimizer

__all__ = ["FP16_UnfusedOptimizer"]
