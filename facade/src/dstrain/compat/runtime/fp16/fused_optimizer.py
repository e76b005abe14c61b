"""`deepspeed.runtime.fp16.fused_optimizer`: the kind of optimizer fp16 at ZeRO stage 0 trains with."""

from ..optimizer_kinds import FP16_Optimizer

__all__ = ["FP16_Optimizer"]
