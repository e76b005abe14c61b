"""`deepspeed.accelerator.cpu_accelerator`: `CPU_Accelerator` (DeepSpeed's class name) is dstrain's CPU accelerator,
for `set_accelerator(CPU_Accelerator())` in scripts that pick the CPU by hand."""

from .cpu import CpuAccelerator as CPU_Accelerator

__all__ = ["CPU_Accelerator"]
