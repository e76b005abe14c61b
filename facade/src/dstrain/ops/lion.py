"""`deepspeed.ops.lion`: DeepSpeed's CPU Lion for ZeRO's optimizer offload and its FusedLion for parameters on a
device (dszero's, one arithmetic)."""

from dszero.ops import DeepSpeedCPULion, FusedLion

__all__ = ["DeepSpeedCPULion", "FusedLion"]
