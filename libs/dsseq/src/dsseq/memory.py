"""`TensorMemory`: the peak bytes of tensor storage made inside a block, on any device (the CPU has no
allocator statistics of its own).

Every storage an operation creates inside the block is counted from its creation until it is freed
(whoever holds it: a Python name, autograd's saved tensors, a view), so the peak covers activations,
their gradients and temporaries; weights and inputs made before the block are not counted. Tracking
costs time: measure speed without it.

    with TensorMemory() as memory:
        model(ids).loss.backward()
    print(memory.peak_bytes)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorMemory(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}  # storage address -> (weak ref, bytes)
        self.live_bytes = 0
        self.peak_bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and not tensor.is_meta:
                storage = tensor.untyped_storage()
                address, size = storage.data_ptr(), storage.nbytes()
                if size and address not in self.live:
                    self.live[address] = (StorageWeakRef(storage), size)
                    self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out

    def _sweep(self) -> None:
        freed = [address for address, (ref, _) in self.live.items() if ref.expired()]
        for address in freed:
            self.live_bytes -= self.live.pop(address)[1]
