"""Where a stage-3 unit's parameter shard lives between uses (`offload_param`).

- `DeviceHome`: on the compute device (no offload).
- `CpuHome`: in its own host buffer, pinned where allowed (`offload_param.device: cpu`); the
  compute copy exists only while the unit is gathered.
- `NvmeHome`: in a swap file (`offload_param.device: nvme`); read into one of `buffer_count`
  host buffers of `buffer_size` elements for the all-gather, and the buffer given back after it.

`ParamHomes` decides per unit, keeping the first `max_in_cpu` elements on the CPU under NVMe
offload. Every home answers `fetch()` (the shard on the compute device, ready to all-gather
from), `done()` (that copy may go), `store(values)` (new shard values) and `where`.
"""

from __future__ import annotations

from typing import Any

import torch

from dsconfig import OffloadParamConfig

from ..errors import ZeroConfigError
from .pinned import host_copy
from .swap import BufferPool, SwapFile, nvme_dir

KEY = "zero_optimization.offload_param"


class DeviceHome:
    where = "device"

    def __init__(self, shard: torch.Tensor):
        self.tensor = shard.clone()

    def fetch(self) -> torch.Tensor:
        return self.tensor

    def done(self) -> None:
        """Nothing was copied."""

    def store(self, values: torch.Tensor) -> None:
        self.tensor.copy_(values)

    def resident(self) -> torch.Tensor | None:
        return self.tensor

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


class CpuHome(DeviceHome):
    where = "cpu"

    def __init__(self, shard: torch.Tensor, pin: bool):
        self.device = shard.device
        self.tensor = host_copy(shard, shard.dtype, pin, KEY)

    def fetch(self) -> torch.Tensor:
        return self.tensor.to(self.device, non_blocking=True)  # the tensor itself when computing on the CPU


class NvmeHome:
    where = "nvme"

    def __init__(self, homes: ParamHomes, shard: torch.Tensor):
        self.homes = homes
        self.device = shard.device
        self.dtype = shard.dtype
        self.numel = shard.numel()
        self.region = homes.swap.allocate(self.numel * shard.element_size())
        homes.swap.write(shard.detach().to("cpu").contiguous(), self.region)
        self.buffer: int | None = None
        self.reading = False

    def prefetch(self) -> bool:
        """Start reading the shard into a free buffer; False when none is free (fetch reads it then)."""
        if self.buffer is not None:
            return True
        self.buffer = self.homes.pool().take()
        if self.buffer is None:
            return False
        self.homes.swap.read_async(self._view(), self.region)
        self.reading = True
        return True

    def spare_buffers(self) -> int:
        """Read buffers this shard could use now: the free ones and any it already holds."""
        return len(self.homes.pool().free) + (self.buffer is not None)

    def fetch(self) -> torch.Tensor:
        if self.buffer is None:
            self.buffer = self.homes.pool().take()
            if self.buffer is None:
                raise ZeroConfigError(f"{KEY}.buffer_count = {self.homes.config.buffer_count}: every buffer is in "
                                      f"use by a prefetched unit; raise buffer_count or lower "
                                      f"stage3_prefetch_bucket_size")
            self.homes.swap.read(self._view(), self.region)
        elif self.reading:
            self.homes.swap.wait()
        self.reading = False
        return self._view().to(self.device, non_blocking=True)

    def done(self) -> None:
        if self.buffer is not None:
            self.homes.pool().give_back(self.buffer)
            self.buffer = None

    def store(self, values: torch.Tensor) -> None:
        self.homes.swap.write(values.detach().to(device="cpu", dtype=self.dtype).contiguous(), self.region)

    def resident(self) -> torch.Tensor | None:
        return None

    @property
    def nbytes(self) -> int:
        return self.region[1]

    def _view(self) -> torch.Tensor:
        return self.homes.pool().view(self.buffer, self.numel, self.dtype)


class ParamHomes:
    """Makes each unit's home as the `offload_param` section says."""

    def __init__(self, config: OffloadParamConfig | None, rank: int, aio_kwargs: dict[str, Any] | None):
        self.config = config
        self.device = config.device if config is not None else "none"
        self.rank = rank
        self.aio_kwargs = aio_kwargs
        self.cpu_left = config.max_in_cpu if self.device == "nvme" else 0
        self._swap: SwapFile | None = None
        self._pool: BufferPool | None = None
        self.largest_nvme = 0
        self.dtype_size = 1

    @property
    def swap(self) -> SwapFile:
        if self._swap is None:
            self._swap = SwapFile(nvme_dir(self.config.nvme_path), "params", self.rank, self.aio_kwargs, KEY)
        return self._swap

    def pool(self) -> BufferPool:
        if self._pool is None:
            # No bigger than the largest shard that needs one: buffer_size is an upper bound, not a reservation.
            nbytes = min(self._buffer_numel(), self.largest_nvme) * self.dtype_size
            self._pool = BufferPool(self.config.buffer_count, nbytes, self.config.pin_memory, KEY)
        return self._pool

    def _buffer_numel(self) -> int:
        return self.config.buffer_size  # ZeroOptimizer resolved "auto" through dsconfig.resolve_auto

    def make(self, shard: torch.Tensor):
        if self.device == "none":
            return DeviceHome(shard)
        if self.device == "cpu":
            return CpuHome(shard, self.config.pin_memory)
        if shard.numel() <= self.cpu_left:
            self.cpu_left -= shard.numel()
            return CpuHome(shard, self.config.pin_memory)
        if shard.numel() > self._buffer_numel():
            raise ZeroConfigError(f"{KEY}.buffer_size = {self.config.buffer_size} elements is smaller than a "
                                  f"parameter shard of {shard.numel()} elements on rank {self.rank}; set it to at "
                                  f"least {shard.numel()}")
        self.largest_nvme = max(self.largest_nvme, shard.numel())
        self.dtype_size = max(self.dtype_size, shard.element_size())
        return NvmeHome(self, shard)

    def buffer_bytes(self) -> int:
        return self._pool.total_bytes() if self._pool is not None else 0

    def close(self) -> None:
        if self._swap is not None:
            self._swap.close()

