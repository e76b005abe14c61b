"""`deepspeed.ops.adam`: DeepSpeedCPUAdam (dszero's fused CPU Adam) and FusedAdam (the same arithmetic on
any device), under DeepSpeed's names and signatures."""

from dszero.ops import DeepSpeedCPUAdam, FusedAdam

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
