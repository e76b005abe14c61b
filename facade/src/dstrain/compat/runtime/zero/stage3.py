"""`deepspeed.runtime.zero.stage3`: the kind of optimizer ZeRO stage 3 trains with (see optimizer_kinds)."""

from ..optimizer_kinds import DeepSpeedZeroOptimizer_Stage3

__all__ = ["DeepSpeedZeroOptimizer_Stage3"]
