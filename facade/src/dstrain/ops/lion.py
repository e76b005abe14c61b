"""`deepspeed.ops.lion`: DeepSpeed's CPU Lion (dszero's, for ZeRO's optimizer offload). DeepSpeed's FusedLion, its
GPU kernel, is not provided (op_builder's FusedLionBuilder says so)."""

from dszero.ops import DeepSpeedCPULion

__all__ = ["DeepSpeedCPULion"]
