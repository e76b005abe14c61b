"""`deepspeed.ops.adagrad`: DeepSpeed's CPU Adagrad (dszero's, for ZeRO's optimizer offload)."""

from dszero.ops import DeepSpeedCPUAdagrad

__all__ = ["DeepSpeedCPUAdagrad"]
