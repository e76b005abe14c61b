"""`deepspeed.runtime.zero.stage_1_and_2`: the kind of optimizer ZeRO stages 1-2 train with (see optimizer_kinds)."""

from ..optimizer_kinds import DeepSpeedZeroOptimizer

__all__ = ["DeepSpeedZeroOptimizer"]
