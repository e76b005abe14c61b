"""`deepspeed.runtime.bf16_optimizer`: the kind of optimizer bf16 at ZeRO stage 0 trains with."""

from .optimizer_kinds import BF16_Optimizer

__all__ = ["BF16_Optimizer"]
