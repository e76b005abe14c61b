"""`deepspeed.accelerator.cuda_accelerator`: `CUDA_Accelerator` (DeepSpeed's class name) is dstrain's CUDA
accelerator, for `set_accelerator(CUDA_Accelerator())` in scripts that pick it by hand."""

from .cuda import CudaAccelerator as CUDA_Accelerator

__all__ = ["CUDA_Accelerator"]
