"""`deepspeed.moe.layer`: the MoE layer (dsmoe's)."""

from dsmoe.layer import MoE

__all__ = ["MoE"]
