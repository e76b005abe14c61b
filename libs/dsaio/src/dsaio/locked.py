"""Page-locked host buffers: `new_cpu_locked_tensor` / `free_cpu_locked_tensor`.

With CUDA, torch's pinned memory (what device copies need). Without it, page-aligned anonymous
memory locked with mlock, so the kernel never pages it out mid-transfer; when RLIMIT_MEMLOCK
refuses, the buffer is still returned (aligned, usable) with a warning that it is not locked.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import warnings
from typing import Any

import numpy as np

_libc = ctypes.CDLL(None, use_errno=True)
_locked: dict[int, tuple[mmap.mmap, int, bool]] = {}  # data address -> (mapping, length, locked)
_pinned: set[int] = set()  # data addresses of torch's pinned tensors handed out (with CUDA)
_lock = threading.Lock()
_warned = False


def _mlock(addr: int, length: int) -> bool:
    global _warned
    if _libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(length)) == 0:
        return True
    err = ctypes.get_errno()
    if not _warned:
        _warned = True
        warnings.warn(f"dsaio: mlock of {length} bytes refused ({os.strerror(err)}); the buffer is aligned "
                      "but not page-locked. Raise the limit with `ulimit -l` (RLIMIT_MEMLOCK).",
                      RuntimeWarning, stacklevel=4)
    return False



def new_cpu_locked_tensor(num_elem: int, example_tensor: Any) -> Any:
    """An uninitialised page-locked buffer of `num_elem` elements of `example_tensor`'s dtype:
    a torch tensor for a torch example, a numpy array for a numpy example."""
    if isinstance(num_elem, bool) or not isinstance(num_elem, int) or num_elem < 0:
        raise ValueError(f"new_cpu_locked_tensor: num_elem must be a non-negative integer, got {num_elem!r}")
    is_numpy = isinstance(example_tensor, np.ndarray)
    if not is_numpy and not hasattr(example_tensor, "element_size"):
        raise TypeError(f"new_cpu_locked_tensor: example_tensor must be a torch tensor or numpy array, "
                        f"got {type(example_tensor).__name__}")
    if not is_numpy:
        import torch

        if torch.cuda.is_available():
            pinned = torch.empty(num_elem, dtype=example_tensor.dtype, pin_memory=True)
            with _lock:  # remembered, so free_cpu_locked_tensor knows it came from here (torch frees the memory)
                _pinned.add(pinned.data_ptr())
            return pinned
    itemsize = example_tensor.itemsize if is_numpy else example_tensor.element_size()
    length = max(num_elem * itemsize, 1)
    mapping = mmap.mmap(-1, length)  # page-aligned and zero-filled by the kernel
    array = np.frombuffer(mapping, dtype=np.uint8, count=num_elem * itemsize)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    locked = _mlock(addr, length)
    if is_numpy:
        out = array.view(example_tensor.dtype)
    else:
        import torch

        out = torch.from_numpy(array).view(example_tensor.dtype) if num_elem else torch.empty(0, dtype=example_tensor.dtype)
    with _lock:
        _locked[addr] = (mapping, length, locked)
    return out


def _address(t: Any) -> int:
    return t.ctypes.data if isinstance(t, np.ndarray) else t.data_ptr()


def free_cpu_locked_tensor(tensor: Any) -> bool:
    """Unlocks a buffer from `new_cpu_locked_tensor`; the memory goes when the last view of it does.
    Returns False for a buffer that did not come from there."""
    with _lock:
        entry = _locked.pop(_address(tensor), None)
        if entry is None and _address(tensor) in _pinned:
            _pinned.discard(_address(tensor))
            return True
    if entry is None:
        return False
    mapping, length, locked = entry
    if locked:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        _libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(length))
    return True


def is_locked(tensor: Any) -> bool:
    with _lock:
        entry = _locked.get(_address(tensor))
        pinned = _address(tensor) in _pinned
    return pinned or bool(entry and entry[2])
