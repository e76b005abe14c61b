"""Swap files on NVMe: tensors parked at fixed, aligned places in one file per rank, moved by dsaio.

    swap = SwapFile(Path(nvme_path), "optimizer", rank, aio_kwargs, key="zero_optimization.offload_optimizer")
    region = swap.allocate(nbytes)
    swap.write(tensor, region); swap.read(tensor, region)       # or write_async(...) + wait()

dsaio's native core is imported only here, so it loads only when NVMe offload is on. dsaio reserves
the blocks of each region before its first write, so a full disk fails before any byte is written.
Each swap directory is marked with its owner; making one removes those of killed runs (swap_owners).
"""

from __future__ import annotations

import os
import shutil
import weakref
from pathlib import Path
from typing import Any

import torch

from dsconfig.resources import format_bytes

from ..errors import ZeroConfigError
from .pinned import pinned_empty
from .resources import memory_bytes
from .swap_owners import make_swap_dir, remove_stale

ALIGNMENT = 4096  # O_DIRECT-friendly offsets on every file system we meet


class SwapFile:
    """One file of fixed regions. The directory is private to this object and removed with it."""

    def __init__(self, nvme_path: Path, purpose: str, rank: int, aio_kwargs: dict[str, Any] | None, key: str):
        import dsaio  # lazily: the native I/O core is not needed unless something is swapped

        try:
            nvme_path.mkdir(parents=True, exist_ok=True)
            remove_stale(nvme_path)
            self.directory = make_swap_dir(nvme_path, f"dszero_{purpose}_rank{rank}_")
        except OSError as exc:
            raise ZeroConfigError(f"{key}.nvme_path = {str(nvme_path)!r} cannot hold swap files ({exc.strerror}); "
                                  f"give a writable directory on a fast local disk") from exc
        self.path = self.directory / f"{purpose}.swp"
        self.path.touch()
        try:
            self.handle = dsaio.aio_handle(**(aio_kwargs or {}))
        except (TypeError, ValueError) as exc:
            raise ZeroConfigError(f"aio settings {aio_kwargs!r} are not valid for dsaio.aio_handle: {exc}") from exc
        self.size = 0
        self._cleanup = weakref.finalize(self, _remove, self.handle, self.directory)

    def allocate(self, nbytes: int) -> tuple[int, int]:
        """A new region (offset, bytes) of at least `nbytes`, aligned."""
        offset = self.size
        self.size += -(-max(nbytes, 1) // ALIGNMENT) * ALIGNMENT
        return offset, nbytes

    def write(self, tensor: torch.Tensor, region: tuple[int, int]) -> None:
        self.handle.sync_pwrite(_flat_bytes(tensor, region), str(self.path), region[0])

    def write_async(self, tensor: torch.Tensor, region: tuple[int, int]) -> None:
        self.handle.async_pwrite(_flat_bytes(tensor, region), str(self.path), region[0])

    def read(self, tensor: torch.Tensor, region: tuple[int, int]) -> None:
        self.handle.sync_pread(_flat_bytes(tensor, region), str(self.path), region[0])

    def read_async(self, tensor: torch.Tensor, region: tuple[int, int]) -> None:
        self.handle.async_pread(_flat_bytes(tensor, region), str(self.path), region[0])

    def wait(self) -> None:
        self.handle.wait()

    def close(self) -> None:
        self._cleanup()


def _flat_bytes(tensor: torch.Tensor, region: tuple[int, int]) -> torch.Tensor:
    view = tensor.reshape(-1).view(torch.uint8)
    if view.numel() != region[1]:
        raise ValueError(f"swap region holds {region[1]} bytes, the tensor has {view.numel()}")
    return view


def _remove(handle: Any, directory: Path) -> None:
    try:
        handle.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class BufferPool:
    """`count` host buffers of `nbytes` each (pinned where allowed), handed out and given back.

    A buffer holds tensors of any dtype: callers view its bytes.
    """

    def __init__(self, count: int, nbytes: int, pin: bool, key: str):
        nbytes = -(-nbytes // ALIGNMENT) * ALIGNMENT
        machine = memory_bytes()
        if count * nbytes > machine:  # refused before the first buffer, not when the host runs out
            raise ZeroConfigError(
                f"{key}.buffer_count = {count}: {count} {'pinned ' if pin else ''}host buffers of "
                f"{format_bytes(nbytes)} each take {format_bytes(count * nbytes)}, but this machine has "
                f"{format_bytes(machine)} of memory; lower buffer_count "
                f"(4 to 8 are typical) or the buffers' size (sub_group_size, offload_param.buffer_size)")
        self.nbytes = nbytes
        self.buffers = [pinned_empty(nbytes, torch.uint8, key) if pin else torch.empty(nbytes, dtype=torch.uint8)
                        for _ in range(count)]
        self.free = list(range(count))

    def take(self) -> int | None:
        """A free buffer's index, or None when all are in use."""
        return self.free.pop(0) if self.free else None

    def give_back(self, index: int) -> None:
        self.free.append(index)

    def view(self, index: int, numel: int, dtype: torch.dtype, offset_bytes: int = 0) -> torch.Tensor:
        size = torch.empty(0, dtype=dtype).element_size()
        return self.buffers[index][offset_bytes: offset_bytes + numel * size].view(dtype)

    def total_bytes(self) -> int:
        return self.nbytes * len(self.buffers)


def nvme_dir(path: str | os.PathLike) -> Path:
    return Path(os.path.expanduser(str(path)))
