"""`dstrain.accelerator`: DeepSpeed's `deepspeed.accelerator`, the device API scripts call.

    from dstrain.accelerator import get_accelerator
    device = get_accelerator().device_name(local_rank)   # "cuda:0", or "cpu"

The backend is picked as DeepSpeed picks it: `DS_ACCELERATOR` (cpu or cuda) when set, else CUDA
where torch sees a GPU, else the CPU.
"""

from .selection import get_accelerator, is_current_accelerator_supported, set_accelerator

__all__ = ["get_accelerator", "is_current_accelerator_supported", "set_accelerator"]
