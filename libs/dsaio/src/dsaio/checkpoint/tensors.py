"""Tensors and arrays as (dtype code, shape, bytes) going out, and back again coming in."""

from __future__ import annotations

from typing import Any

import numpy as np

from .format import DTYPES, dtype_code


def is_torch(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def host_bytes(obj: Any) -> tuple[str, tuple[int, ...], Any, int, int]:
    """(dtype code, shape, owner, address, nbytes) of a C-contiguous host copy of `obj`."""
    if isinstance(obj, np.ndarray):
        arr = obj if obj.flags.c_contiguous else obj.copy(order="C")  # ascontiguousarray would make 0-d 1-d
        return dtype_code(arr), tuple(arr.shape), arr, arr.ctypes.data, arr.nbytes
    if is_torch(obj):
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        return dtype_code(t), tuple(t.shape), t, t.data_ptr(), t.numel() * t.element_size()
    raise TypeError(f"expected a torch tensor or a numpy array, got {type(obj).__name__}")


def as_numpy(data: np.ndarray, code: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    np_dtype = DTYPES[code][0]
    if np_dtype is None:
        raise TypeError(f"tensor {name!r} is {code}, which numpy has no dtype for; load with framework='pt'")
    return data.view(np_dtype).reshape(shape)


def as_torch(data: np.ndarray, code: str, shape: tuple[int, ...]) -> Any:
    import torch

    dtype = getattr(torch, DTYPES[code][1])
    t = torch.from_numpy(data)  # shares memory with the one buffer the file was read into
    if data.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return t.view(dtype).reshape(shape)
