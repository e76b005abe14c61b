"""Turn what callers pass (numpy arrays, buffer objects, torch tensors) into an address and a size.

torch is never imported here: a tensor is recognised by its methods (`data_ptr`, `numel`,
`element_size`, `is_contiguous`, `device`). Tensors on an accelerator are staged through a
pinned CPU tensor: reads land there and are copied to the device when the request completes.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RawBuffer:
    addr: int
    nbytes: int
    keepalive: Any  # the object that owns the memory, held until the request completes
    finish: Callable[[], None] | None = field(default=None)  # e.g. copy a staged read to the GPU


def _is_tensor(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("data_ptr", "numel", "element_size", "is_contiguous", "device"))


def _tensor(obj: Any, for_read: bool, what: str) -> RawBuffer:
    if not obj.is_contiguous():
        raise ValueError(f"{what}: tensor must be contiguous (shape {tuple(obj.shape)}, strides {obj.stride()}); "
                         "call .contiguous() first")
    if getattr(obj, "is_sparse", False):
        raise ValueError(f"{what}: sparse tensors have no single byte range; pass .to_dense()")
    nbytes = obj.numel() * obj.element_size()
    if obj.device.type == "cpu":
        return RawBuffer(obj.data_ptr(), nbytes, obj)
    if obj.device.type == "meta":
        raise ValueError(f"{what}: a tensor on the meta device has no memory to read or write")
    # Device memory: go through a page-locked host copy (DMA-able, so the device copy is fast).
    staging = obj.new_empty(obj.shape, device="cpu", pin_memory=True)
    if for_read:
        return RawBuffer(staging.data_ptr(), nbytes, (staging, obj), finish=lambda: obj.copy_(staging))
    staging.copy_(obj)
    return RawBuffer(staging.data_ptr(), nbytes, (staging, obj))


def as_raw(obj: Any, for_read: bool, what: str = "buffer") -> RawBuffer:
    """Address and size of `obj`. `for_read` means the file is read into it, so it must be writable."""
    if _is_tensor(obj):
        return _tensor(obj, for_read, what)
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise TypeError(f"{what}: expected a torch tensor, a numpy array or a buffer object, "
                            f"got {type(obj).__name__}") from None
        if not view.c_contiguous:
            raise ValueError(f"{what}: buffer must be C-contiguous")
        arr = np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view, dtype=np.uint8)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what}: array must be C-contiguous (strides {arr.strides}); use numpy.ascontiguousarray")
    if for_read and not arr.flags.writeable:
        raise ValueError(f"{what}: a read needs a writable buffer, got a read-only {type(obj).__name__}")
    return RawBuffer(arr.ctypes.data if arr.nbytes else 0, arr.nbytes, (obj, arr))


def fresh_empty(nbytes: int, alignment: int) -> np.ndarray:
    """`aligned_empty` on small pages, for a large buffer about to be filled by reads (a checkpoint being
    loaded): finding a gigabyte of the huge pages numpy asks for can mean compacting memory first. Cold
    1 GiB loads here: 1.4 to 8 s with huge pages; 1.3 s on small pages faulted in by the direct reads,
    the same as making them ahead of each read, and faster than all before the first (1.75 s)."""
    if nbytes < (1 << 20):
        return aligned_empty(nbytes, alignment)
    mapping = mmap.mmap(-1, nbytes + alignment)
    with contextlib.suppress(OSError, AttributeError):  # no MADV_NOHUGEPAGE: the system's default pages
        mapping.madvise(mmap.MADV_NOHUGEPAGE)
    raw = np.frombuffer(mapping, dtype=np.uint8)  # holds the mapping for as long as any view lives
    skip = (-raw.ctypes.data) % alignment
    return raw[skip : skip + nbytes]


def aligned_empty(nbytes: int, alignment: int) -> np.ndarray:
    """A uint8 array of `nbytes` whose first byte sits on an `alignment` boundary."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    skip = (-raw.ctypes.data) % alignment
    return raw[skip : skip + nbytes]
