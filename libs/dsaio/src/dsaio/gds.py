"""`gds_handle`: DeepSpeed's GPUDirect Storage handle.

GDS moves bytes between NVMe and GPU memory without a host copy; it needs a CUDA GPU, NVIDIA's
cuFile library and the nvidia-fs kernel driver. Where any is missing the constructor says which.
Where all are there, requests go through aio_handle's pinned-host staging path (correct, not yet
zero-copy: a cuFile binding is future work) and the device-pinning calls are accepted.
"""

from __future__ import annotations

import ctypes.util
import errno
import os
from typing import Any

from .errors import AioError
from .handle import aio_handle


def gds_missing() -> list[str]:
    """What GDS needs and this machine lacks (empty when GDS could work here)."""
    missing = []
    try:
        import torch
    except ImportError:
        missing.append("torch with CUDA (torch is not installed)")
    else:
        if not torch.cuda.is_available():
            missing.append("a CUDA GPU (torch.cuda.is_available() is False)")
    if ctypes.util.find_library("cufile") is None:
        missing.append("NVIDIA's cuFile library (libcufile.so, from the GDS package)")
    if not os.path.exists("/proc/driver/nvidia-fs"):
        missing.append("the nvidia-fs kernel driver (/proc/driver/nvidia-fs is absent)")
    return missing


class gds_handle(aio_handle):  # DeepSpeed's name, lower case
    def __init__(self, block_size: int = 1048576, queue_depth: int = 8, single_submit: bool = False,
                 overlap_events: bool = True, intra_op_parallelism: int = 1, engine: str | None = None) -> None:
        missing = gds_missing()
        if missing:
            raise AioError(errno.ENODEV, None, "gds_handle",
                           "GPUDirect Storage is not available here; missing: " + "; ".join(missing)
                           + ". Use dsaio.aio_handle, which also reads and writes CUDA tensors via pinned host memory")
        super().__init__(block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism, engine)
        self._pinned: set[int] = set()

    def new_pinned_device_tensor(self, num_elem: int, example_tensor: Any) -> Any:
        import torch

        t = torch.empty(num_elem, dtype=example_tensor.dtype, device=example_tensor.device)
        self._pinned.add(t.data_ptr())
        return t

    def free_pinned_device_tensor(self, tensor: Any) -> bool:
        self._pinned.discard(tensor.data_ptr())
        return True

    def pin_device_tensor(self, tensor: Any) -> bool:
        self._pinned.add(tensor.data_ptr())
        return True

    def unpin_device_tensor(self, tensor: Any) -> bool:
        self._pinned.discard(tensor.data_ptr())
        return True
