"""`PinMemoryBuilder().load()`: page-locked host buffers without the async I/O op (dsaio's locked memory)."""

from __future__ import annotations

from typing import Any

from dsaio.locked import free_cpu_locked_tensor, is_pinned, new_cpu_locked_tensor


class pin_handle:  # DeepSpeed's name, lower case
    """Allocates, frees and recognises page-locked CPU buffers (DeepSpeed's pin_memory op's handle)."""

    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: Any) -> Any:
        return new_cpu_locked_tensor(num_elem, example_tensor)

    def free_cpu_locked_tensor(self, tensor: Any) -> bool:
        return free_cpu_locked_tensor(tensor)

    def is_pinned(self, tensor: Any) -> bool:
        return is_pinned(tensor)
