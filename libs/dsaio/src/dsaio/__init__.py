"""dsaio: DeepSpeed's DeepNVMe (`aio_handle`) and safe checkpoint files, installable alone.

    h = dsaio.aio_handle(intra_op_parallelism=4)
    h.async_pwrite(tensor, "/nvme/t.bin"); h.wait()
    dsaio.save({"w": tensor}, "/nvme/ckpt.safetensors"); dsaio.load("/nvme/ckpt.safetensors")

Needs numpy; torch is optional and never imported by `import dsaio`.
"""

from ._version import __version__
from .checkpoint import (
    CheckpointError,
    check_state_dict,
    load,
    load_state_dict,
    load_with_metadata,
    read_metadata,
    save,
    save_state_dict,
)
from .engines import backends
from .errors import AioError
from .gds import gds_handle
from .handle import aio_handle
from .limits import QueueLimits, queue_limits
from .locked import free_cpu_locked_tensor, new_cpu_locked_tensor

__all__ = [
    "AioError",
    "CheckpointError",
    "QueueLimits",
    "__version__",
    "aio_handle",
    "backends",
    "check_state_dict",
    "free_cpu_locked_tensor",
    "gds_handle",
    "load",
    "load_state_dict",
    "load_with_metadata",
    "new_cpu_locked_tensor",
    "queue_limits",
    "read_metadata",
    "save",
    "save_state_dict",
]
