"""Page-locked (pinned) host buffers for offloaded state, and the fallback when pinning is refused.

With CUDA, torch's pinned memory (what fast device copies need). Without it, dsaio's
mlock-ed buffers, so the kernel never pages offloaded state out under an NVMe transfer. When the
memlock limit (`ulimit -l`) refuses, training goes on with pageable memory and one warning that
names the config key to change.
"""

from __future__ import annotations

import warnings
import weakref

import torch

import dsaio

_warned: set[str] = set()


def _refused(key: str, why: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"dszero: {key}.pin_memory is true but pinning was refused ({why}); continuing with pageable "
                  f"memory, which is slower to copy. Raise the memlock limit (ulimit -l / RLIMIT_MEMLOCK) or set "
                  f"{key}.pin_memory: false to silence this", RuntimeWarning, stacklevel=4)


def pinned_empty(numel: int, dtype: torch.dtype, key: str) -> torch.Tensor:
    """An uninitialised host buffer, page-locked where the system allows; `key` names the config section."""
    if torch.cuda.is_available():
        try:
            return torch.empty(numel, dtype=dtype, pin_memory=True)
        except RuntimeError as exc:
            _refused(key, str(exc).splitlines()[0])
            return torch.empty(numel, dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buffer = dsaio.new_cpu_locked_tensor(numel, torch.empty(0, dtype=dtype))
    if caught:
        _refused(key, str(caught[0].message).split(";")[0].removeprefix("dsaio: "))
    if numel:
        # Unlock when the buffer is garbage; the memory itself goes with its last view.
        # (a storage-sharing tensor, not a view: a view would keep `buffer` itself alive).
        handle = torch.empty(0, dtype=dtype).set_(buffer.untyped_storage(), 0, (0,))
        weakref.finalize(buffer, dsaio.free_cpu_locked_tensor, handle)
    return buffer


def host_copy(tensor: torch.Tensor, dtype: torch.dtype, pin: bool, key: str) -> torch.Tensor:
    """A flat host copy of `tensor` in `dtype`, pinned when `pin` is set."""
    if not pin:
        return tensor.detach().to(device="cpu", dtype=dtype, copy=True).reshape(-1)
    out = pinned_empty(tensor.numel(), dtype, key)
    out.copy_(tensor.detach().reshape(-1))
    return out
